"""Each image's SBOM, a CycloneDX 1.6 JSON document: the Debian packages the image's dpkg database
lists as installed and the Python distributions whose `.dist-info` it holds, read from the OCI
archive's layers (what the image ships, not what the builder meant to install).

`python -m images.sbom --out DIR [NAME...]` writes DIR/<name>.cdx.json for images.builder's images
(all by default); scripts/release.sh attaches each to its image with `cosign attest --type cyclonedx`.
Each is kept beside its archive, which never changes once built: reading the layers of the CPU
runtime takes most of 20 s, which `make test`'s release test would otherwise spend on every run.
"""

from __future__ import annotations

import argparse
import email.parser
import re
from dataclasses import dataclass
from pathlib import Path

from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from images.builder.cache import atomic_path
from images.builder.oci import read_archive, walk

DPKG_STATUS = "var/lib/dpkg/status"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
DIST_INFO_METADATA = re.compile(r"(^|/)[^/]+\.dist-info/METADATA$")


@dataclass(frozen=True)
class Package:
    kind: str  # a purl type: deb or pypi
    name: str
    version: str
    arch: str = ""


def read_files(archive: Path) -> dict[str, bytes]:
    """The files of the image the SBOM is made from, as the last layer holding each leaves it."""
    found: dict[str, bytes] = {}
    for tar, member in walk(read_archive(archive)):
        name = member.name.removeprefix("./")
        if member.isfile() and (name == DPKG_STATUS or name in OS_RELEASE or DIST_INFO_METADATA.search(name)):
            stream = tar.extractfile(member)
            assert stream is not None  # a regular file
            found[name] = stream.read()
    return found


def packages(files: dict[str, bytes]) -> list[Package]:
    """The installed Debian packages (dpkg's status paragraphs) and Python distributions."""
    parser = email.parser.HeaderParser()
    found: set[Package] = set()
    for paragraph in files.get(DPKG_STATUS, b"").decode().split("\n\n"):
        fields = parser.parsestr(paragraph)
        if fields["Package"] and (fields["Status"] or "").endswith(" installed"):
            found.add(Package("deb", fields["Package"], fields["Version"], fields["Architecture"] or ""))
    for name, data in files.items():
        if DIST_INFO_METADATA.search(name):
            meta = parser.parsestr(data.decode(errors="replace"))
            found.add(Package("pypi", meta["Name"], meta["Version"]))
    return sorted(found, key=lambda p: (p.kind, p.name.lower(), p.version))


def distro(files: dict[str, bytes]) -> str:
    """`debian-12` from os-release, as purls of Debian packages name it."""
    for name in OS_RELEASE:
        if name in files:
            fields = dict(line.split("=", 1) for line in files[name].decode().splitlines() if "=" in line)
            return f"{fields.get('ID', '').strip(chr(34))}-{fields.get('VERSION_ID', '').strip(chr(34))}"
    return ""


def purl(package: Package, distribution: str) -> PackageURL:
    if package.kind == "deb":
        qualifiers = {"arch": package.arch, **({"distro": distribution} if distribution else {})}
        return PackageURL(
            "deb", distribution.split("-")[0] or "debian", package.name, package.version, qualifiers
        )
    return PackageURL("pypi", None, re.sub(r"[-_.]+", "-", package.name).lower(), package.version)


def sbom(name: str, version: str, files: dict[str, bytes]) -> str:
    """The CycloneDX JSON of image `name` at `version` holding `files` (read_files)."""
    bom = Bom()
    image = Component(type=ComponentType.CONTAINER, name=name, version=version, bom_ref=f"image:{name}")
    bom.metadata.component = image
    distribution = distro(files)
    components = []
    for package in packages(files):
        ref = purl(package, distribution)
        components.append(
            Component(name=package.name, version=package.version, purl=ref, bom_ref=ref.to_string())
        )
    bom.components.update(components)
    bom.register_dependency(image, components)
    return JsonV1Dot6(bom).output_as_string(indent=1)


def cached(name: str, version: str, archive: Path) -> str:
    """sbom() of `archive`, written beside it the first time."""
    path = archive.with_name(f"{archive.name}.{version}.cdx.json")
    if not path.is_file():
        with atomic_path(path) as tmp:
            tmp.write_text(sbom(name, version, read_files(archive)))
    return path.read_text()


def main(argv: list[str] | None = None) -> int:
    from images.builder.images import SPECS, build
    from images.push import project_version

    parser = argparse.ArgumentParser(prog="python -m images.sbom", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"images: {', '.join(SPECS)}")
    parser.add_argument("--out", type=Path, required=True, help="directory the documents go to")
    parser.add_argument("--version", default=project_version(), help="the images' version")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or SPECS:
        document = cached(name, args.version, build(name, log=lambda line: None))
        (args.out / f"{name}.cdx.json").write_text(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
