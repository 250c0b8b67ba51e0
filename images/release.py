"""What scripts/release.sh needs beyond building and pushing: the images' digests, the chart's
default values pinned to them, and (where no GitHub workflow attests the build) an SLSA v1
provenance predicate for `cosign attest --type slsaprovenance1`.

`python -m images.release digests`                 prints `<name> <digest>` per image of images.builder
`python -m images.release pin VALUES`              pins the chart's values.yaml (image.digest, image.digests)
`python -m images.release provenance NAME DIGEST`  prints the predicate of one pushed artifact
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from images.push import REPO, manifest_digest

DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
# The default lines of values.yaml the release fills in (their comments stay as they are).
OPERATOR_DIGEST_LINE = '  digest: ""\n'
DIGESTS_LINE = "  digests: {}\n"
OPERATOR = "operator"  # image.repository's own image; the others sit beside it (image.digests)
# Named by content (its tag is the hash of the files it copies, which the operator computes): a digest
# would name one build, and a rebuild of the same files would then change every pod template.
UNPINNED = frozenset({"launcher"})
BUILD_TYPE = "https://github.com/llm-operator/llm-operator/scripts/release.sh@v1"


def digests() -> dict[str, str]:
    from images.builder.images import SPECS, build

    return {name: manifest_digest(build(name, log=lambda line: None)) for name in SPECS}


def pin(values: str, found: dict[str, str]) -> str:
    """values.yaml with the operator's digest in image.digest and the other images' in image.digests,
    so the packaged chart's default images name exactly what was pushed."""
    if any(not DIGEST.fullmatch(d) for d in found.values()) or OPERATOR not in found:
        raise ValueError(f"expected sha256 digests, the operator's among them: {found}")
    for line in (OPERATOR_DIGEST_LINE, DIGESTS_LINE):
        if values.count(line) != 1:
            raise ValueError(f"values.yaml must hold {line.strip()!r} once, as the chart ships it")
    others = "".join(f"    {name}: {digest}\n" for name, digest in sorted(found.items())
                     if name != OPERATOR and name not in UNPINNED)  # fmt: skip
    values = values.replace(OPERATOR_DIGEST_LINE, f'  digest: "{found[OPERATOR]}"\n')
    return values.replace(DIGESTS_LINE, f"  digests:\n{others}" if others else DIGESTS_LINE)


def provenance(name: str, digest: str, env: dict[str, str], commit: str) -> dict[str, Any]:
    """An SLSA v1 provenance predicate for artifact `name` at `digest` built from `commit`: the
    workflow run (GITHUB_* variables) when there is one, else this machine's release.sh."""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest}")
    server, repository = env.get("GITHUB_SERVER_URL", ""), env.get("GITHUB_REPOSITORY", "")
    source = f"git+{server}/{repository}" if server and repository else f"git+file://{REPO}"
    run = env.get("GITHUB_RUN_ID", "")
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"artifact": name, "ref": env.get("GITHUB_REF", "")},
            "resolvedDependencies": [{"uri": source, "digest": {"gitCommit": commit}}],
        },
        "runDetails": {
            "builder": {
                "id": f"{server}/{repository}/actions/runs/{run}" if run else "local:scripts/release.sh"
            },
            "metadata": {
                "invocationId": run or f"{name}@{digest}",
                "startedOn": datetime.now(UTC).isoformat(),
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.release", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("digests")
    pin_parser = sub.add_parser("pin")
    pin_parser.add_argument("values", type=Path)
    prov_parser = sub.add_parser("provenance")
    prov_parser.add_argument("name")
    prov_parser.add_argument("digest")
    args = parser.parse_args(argv)
    try:
        if args.command == "digests":
            print("\n".join(f"{name} {digest}" for name, digest in digests().items()))
        elif args.command == "pin":
            args.values.write_text(pin(args.values.read_text(), digests()))
        else:
            commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()  # fmt: skip
            print(json.dumps(provenance(args.name, args.digest, dict(os.environ), commit)))
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        print(f"images.release: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
