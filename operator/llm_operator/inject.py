"""What the init container of every serving pod and build Job copies (render/inject.py): the
standard-library-only part of this package, into an emptyDir that the main container (NVIDIA's
image, unchanged) puts on its PYTHONPATH to run `python3 -m llm_operator.runtime.launcher` or
`python3 -m llm_operator.engine.build` with its own python3, and the OpenAI front door (frontdoor/)
that the launcher starts beside Triton.

The launcher image (images/builder/launcher.py) holds exactly files() under LAUNCHER_SOURCE and a
static busybox that copies them (copy_command), tagged content_tag(): a hash of those files, which
the builder computes from the checkout and the operator from its own installed package with this
one function. An operator release that leaves these files as they were names the same image, so
its pod templates are unchanged and no serving pod rolls.

`python -m llm_operator.inject DEST` copies the same files with python (tests, and the cpu-runtime
image test, use it as the init container's stand-in).

Standard library only, like everything it copies (tests/unit/test_inject.py imports the copy with
nothing else on sys.path), except the front door, which also uses jinja2 and tokenizers (the
serving images have both: NVIDIA's through transformers, the CPU runtime image pins them) and the
LIBRARIES no image promises, copied beside llm_operator/ with their licenses and metadata: h11,
its HTTP/1.1 parser. They come from the operator's own environment, where pyproject.toml pins each to one
version and requirements/*.lock to its files' hashes, so the builder's checkout and the operator's
install hash the same bytes; their source is never in this repository.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import sys
from pathlib import Path, PurePosixPath

PACKAGE = Path(__file__).resolve().parent
# In the launcher image: llm_operator/<files()> under LAUNCHER_SOURCE, and the copier.
LAUNCHER_SOURCE = "/launcher"
COPIER = "/busybox"
# 64 bits of sha256: a tag names one set of files among a project's releases, not an adversary's.
TAG_HEX = 16
# Pure-Python packages the front door imports (frontdoor/http1.py), shipped as DEST/<name>/.
LIBRARIES = ("h11",)
LICENSE = "LICENSE.txt"  # a library's license, in its copy


def copy_command(dest: str) -> list[str]:
    """The launcher image's copy into DEST: `SOURCE/.` merges into DEST (a rerun after a pod's
    sandbox restart overwrites what the emptyDir kept, as copy() does), giving DEST/llm_operator/."""
    return [COPIER, "cp", "-R", "-f", f"{LAUNCHER_SOURCE}/.", dest]


def content_hash(package: Path = PACKAGE) -> str:
    """sha256 over sources(), in order, each as its path under DEST, its length and its bytes
    (lengths keep one file's end from passing for the next one's start)."""
    digest = hashlib.sha256()
    for rel, source in sources(package):
        data = source.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def content_tag(package: Path = PACKAGE) -> str:
    """The launcher image's tag for the files of `package` (the installed one by default)."""
    return content_hash(package)[:TAG_HEX]


def files(package: Path = PACKAGE) -> list[Path]:
    """Paths relative to the package: its root `__init__.py`, the serving contract, the launcher
    (runtime/ without cpu_reference/, which needs torch and stays in the cpu-runtime image) and the
    build Job's entry points (engine/build.py in NVIDIA's image, with the tokenizer_info.py it
    imports; engine/fetch.py in the fetch image), and the front door with its subpackages.
    engine/__init__.py is left out: it renders the build Job (pydantic), and without it engine/ is
    a namespace package, which is all `-m llm_operator.engine.build` needs."""
    runtime = sorted(p.relative_to(package) for p in (package / "runtime").glob("*.py"))
    engine = [Path("engine/build.py"), Path("engine/fetch.py"), Path("engine/tokenizer_info.py")]
    frontdoor = sorted(p.relative_to(package) for p in (package / "frontdoor").rglob("*.py")
                       if "__pycache__" not in p.parts)  # fmt: skip
    return [Path("__init__.py"), Path("contract.py"), *runtime, *engine, *frontdoor]


def library_files(name: str, package: Path = PACKAGE) -> list[tuple[str, Path]]:
    """A library's modules, license and metadata: (path under DEST, source). Read from beside
    `package` where a shipped copy lies there (the launcher image's, a test's: with its license at
    its root), else from the installed distribution (in site-packages the library lies beside the
    package too, its license in its dist-info). The metadata (its dist-info's METADATA, beside the
    library as in site-packages) names it and its version to the launcher image's SBOM and to
    importlib.metadata in a pod."""
    beside = package.parent / name
    # Its own dist-info, not that of a distribution named `{name}-x`.
    shipped_metadata = [m for m in sorted(package.parent.glob(f"{name}-*.dist-info/METADATA"))
                        if f"\nName: {name}\n" in f"\n{m.read_text(errors='replace')}"]  # fmt: skip
    if (beside / "__init__.py").is_file() and (beside / LICENSE).is_file() and len(shipped_metadata) == 1:
        root, license_file, metadata = beside, beside / LICENSE, shipped_metadata[0]
    else:
        dist = importlib.metadata.distribution(name)
        root = Path(str(dist.locate_file(name)))
        found = [f for f in dist.files or () if f.name.startswith(("LICENSE", "COPYING"))]
        if not found:
            raise FileNotFoundError(f"the installed {name} has no license file to ship with it")
        license_file = Path(str(dist.locate_file(found[0])))
        (record,) = [f for f in dist.files or () if f.name == "METADATA" and f.parent.suffix == ".dist-info"]
        metadata = Path(str(dist.locate_file(record)))
    modules = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    shipped = [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in modules]
    return [*shipped, (f"{name}/{LICENSE}", license_file), (f"{metadata.parent.name}/METADATA", metadata)]


def sources(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    """Every injected file: its path under DEST (llm_operator/..., then each library's) and the
    file it is copied from."""
    ours = [(str(PurePosixPath("llm_operator", rel.as_posix())), package / rel) for rel in files(package)]
    return ours + [entry for name in LIBRARIES for entry in library_files(name, package)]


def copy(dest: Path, package: Path = PACKAGE) -> list[Path]:
    """Copy sources() of `package` to DEST (DEST/llm_operator/, DEST/h11/, DEST/h11-*.dist-info/);
    returns what it wrote."""
    written = []
    for rel, source in sources(package):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llm_operator.inject DEST", file=sys.stderr)
        return 2
    written = copy(Path(args[0]))
    print(f"llm_operator: {len(written)} files copied to {args[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
