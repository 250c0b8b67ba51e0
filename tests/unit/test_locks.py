"""The Python locks pin every file by hash, and every environment and image is made hash-checked.

scripts/lock.sh writes requirements/*.lock with the sha256 of each file PyPI has for a pinned
version; scripts/ensure-venv.sh and ensure-tool-venv.sh install them with --require-hashes, pip
itself included, so a changed file on the index fails the install instead of running in CI. The
images install requirements/image-*.lock the same way, in their Dockerfiles and in images.builder;
only what has no hash to check goes in apart, without its dependencies (UNHASHED)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from images.builder import debian, images, locks
from images.builder.dockerfile import instructions

REPO = Path(__file__).resolve().parents[2]
LOCKS = sorted((REPO / "requirements").glob("*.lock"))
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")
HASH = re.compile(r"^    --hash=sha256:[0-9a-f]{64}( \\)?$")
DOCKERFILES = sorted((REPO / "images").glob("*.Dockerfile"))
# (image, requirement) installed without a hash: our package, built in the same build, and torch
# from PyTorch's CPU index, which was out of reach where the locks were written.
UNHASHED = {("operator", "."), ("cpu-runtime", "torch==1.13.1+cpu")}
# What images.builder installs, by the Dockerfile that installs the same lock.
BUILDER_LOCKS = {
    "operator": images.OPERATOR_LOCK,
    "fetch": images.FETCH_LOCK,
    "cpu-runtime": images.CPU_RUNTIME_LOCK,
}


@pytest.mark.parametrize("lock", LOCKS, ids=[p.stem for p in LOCKS])
def test_every_requirement_is_pinned_with_the_hashes_of_its_files(lock: Path) -> None:
    lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
    assert lines, f"{lock.name} is empty"
    requirement = None
    hashes: dict[str, int] = {}
    for line in lines:
        if match := REQUIREMENT.match(line):
            requirement = match.group(1)
            hashes[requirement] = 0
        else:
            assert HASH.match(line), f"{lock.name}: not a pin or a sha256 hash: {line!r}"
            assert requirement is not None, f"{lock.name}: a hash before any requirement"
            hashes[requirement] += 1
    assert all(hashes.values()), f"{lock.name}: without hashes: {[n for n, c in hashes.items() if not c]}"
    assert set(locks.pins(lock)) == {canonicalize_name(n) for n in hashes}


@pytest.mark.parametrize("script", ["ensure-venv.sh", "ensure-tool-venv.sh"])
def test_environments_are_installed_hash_checked_pip_first(script: Path) -> None:
    lines = (REPO / "scripts" / script).read_text().splitlines()
    installs = [line for line in lines if 'pip" install' in line and " -r " in line]  # not the editable -e .
    assert installs and all("--require-hashes" in line and "--no-deps" in line for line in installs), installs
    assert "requirements/pip.lock" in installs[0], "pip itself comes first, from its own lock"


def test_the_clients_environments_have_locks_and_make_test_installs_them() -> None:
    from e2e.tool_venvs import ENVIRONMENTS

    assert all((REPO / "requirements" / f"{name}.lock").exists() for name in ENVIRONMENTS)
    assert '"$PY" -m tests.e2e.clients' in (REPO / "scripts" / "test.sh").read_text()
    lock = (REPO / "requirements" / "inference-perf.lock").read_text()
    assert "# python: 3.12" in lock.splitlines(), "inference-perf requires Python >= 3.12"


def test_a_lock_without_some_requirements_keeps_the_others_hashes(tmp_path: Path) -> None:
    lock = REPO / "requirements" / "image-cpu-runtime.lock"
    kept = locks.write_without(lock, {"numpy", "typing-extensions"}, tmp_path / "kept.lock")
    assert set(locks.pins(kept)) == set(locks.pins(lock)) - {"numpy", "typing-extensions"}
    hashes = {line for line in lock.read_text().splitlines() if "--hash=" in line}
    kept_hashes = {line for line in kept.read_text().splitlines() if "--hash=" in line}
    assert kept_hashes < hashes and len(kept_hashes) > len(locks.pins(kept)), "each kept pin keeps its hashes"


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments of every `pip install` (`pip`, `.../bin/pip`, `python -m pip`) in RUN steps."""
    found = []
    for op, rest in instructions(dockerfile):
        for command in re.split(r"&&|\|\||;", rest) if op == "RUN" else []:
            words = shlex.split(command)
            found += [
                words[i + 2 :]
                for i, w in enumerate(words[:-2])
                if w.endswith("pip") and words[i + 1] == "install"
            ]
    return found


def split(arguments: list[str]) -> tuple[set[str], list[str], list[str]]:
    """(flags, requirement files, requirements) of a pip install's arguments."""
    flags, files, requirements = set(), [], []
    words = iter(arguments)
    for word in words:
        if word in ("-r", "--requirement"):
            files.append(next(words))
        elif word in ("-c", "--constraint", "-i", "--index-url", "--extra-index-url"):
            flags.add(f"{word} {next(words)}")
        elif word.startswith("-"):
            flags.add(word)
        else:
            requirements.append(word)
    return flags, files, requirements


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[d.stem for d in DOCKERFILES])
def test_every_pip_install_of_an_image_is_hash_checked_from_a_lock(dockerfile: Path) -> None:
    copied = {
        Path(src).name for op, rest in instructions(dockerfile) if op == "COPY" for src in rest.split()[:-1]
    }
    for arguments in pip_installs(dockerfile):
        flags, files, requirements = split(arguments)
        assert "--no-deps" in flags, f"{arguments}: a dependency would come in unchecked, or unlocked"
        if "--require-hashes" in flags:
            assert files and not requirements, f"{arguments}: exactly what requirement files pin"
            for file in files:
                assert Path(file).name in copied, f"{file} is not COPY'd into the build"
                assert (REPO / "requirements" / Path(file).name).is_file(), (
                    f"{file} is not a lock of requirements/"
                )
        else:
            assert not files, f"{arguments}: a requirement file without --require-hashes"
            unhashed = {(dockerfile.stem, r) for r in requirements}
            assert unhashed <= UNHASHED, f"installed without a hash: {sorted(unhashed - UNHASHED)}"


@pytest.mark.parametrize("image", BUILDER_LOCKS)
def test_the_builder_installs_the_lock_its_dockerfile_installs(image: str) -> None:
    installed = {
        Path(f).name for a in pip_installs(REPO / "images" / f"{image}.Dockerfile") for f in split(a)[1]
    }
    assert Path(BUILDER_LOCKS[image]).name in installed


def test_the_builder_downloads_and_installs_a_lock_hash_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(debian, "run", lambda *args, **kwargs: calls.append([str(a) for a in args]))
    (tmp_path / "wheels").mkdir()
    monkeypatch.setattr(debian, "wheelhouse", lambda: tmp_path / "wheels")
    lock = REPO / images.FETCH_LOCK
    debian.download(lock)
    debian.pip_install(tmp_path / "rootfs", lock)
    assert len(calls) == 2
    for call in calls:
        assert {"--require-hashes", "--no-deps", "-r"} <= set(call) and call[-1].endswith(lock.name), call


@pytest.mark.parametrize("lock", [p for p in LOCKS if p.stem.startswith("image-")], ids=lambda p: p.stem)
def test_images_pin_what_the_tests_run(lock: Path) -> None:
    """scripts/lock.sh resolves the image locks under dev.lock's pins."""
    dev, pinned = locks.pins(REPO / "requirements" / "dev.lock"), locks.pins(lock)
    assert {n: v for n, v in pinned.items() if n in dev and dev[n] != v} == {}
