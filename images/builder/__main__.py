"""`python -m images.builder [--all | NAME...]`: build (or reuse) each image's OCI archive and
print its path, size and build time, one line per image."""

from __future__ import annotations

import argparse
import os
import sys
import time

from images.builder.images import SPECS, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.builder", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"images to build: {', '.join(SPECS)}")
    parser.add_argument("--all", action="store_true", help="build every image")
    args = parser.parse_args(argv)
    names = list(SPECS) if args.all else args.names
    unknown = [n for n in names if n not in SPECS]
    if not names or unknown:
        parser.error(
            f"name images to build ({', '.join(SPECS)}) or pass --all"
            + (f"; unknown: {unknown}" if unknown else "")
        )
    if os.geteuid() != 0:
        parser.error("building needs root (debootstrap, chroot)")
    if sys.version_info[:2] != (3, 11):
        parser.error("run it with Python 3.11: it downloads wheels for the images' Debian python3.11")
    for name in names:
        start = time.monotonic()
        path = build(name, log=lambda line: print(line, file=sys.stderr))
        print(f"{path}\t{path.stat().st_size / 2**20:.1f} MiB\t{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
