"""Debian rootfs steps: debootstrap (cached per package set), pip inside a chroot, trimming.

The images are made from Debian bookworm packages and PyPI wheels instead of a base image (no
registry here). Network access happens on the host only. debootstrap fetches .debs into a shared
cache, each checked against the suite's Release file, which Debian's archive key signs; the suite
is the live one, not a snapshot, so a rebuild picks up point releases (Base.key pins nothing, its
packages.txt records what was resolved). `pip download` fetches the wheels of a hash-pinned lock
into another cache; pip inside the chroot installs offline from it, hash-checked, so it writes the
rootfs's own paths and `#!/usr/bin/python3` shebangs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from images.builder.cache import atomic_path, cache_root, inputs_hash, remove

SUITE, MIRROR, VARIANT = "bookworm", "http://deb.debian.org/debian", "minbase"
NONROOT = 65532  # distroless' nonroot: the uid the Dockerfiles run as
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
}
# Where Debian's python3 and the wheels pip installs into the rootfs keep their modules.
PYTHON_PATHS = (
    "/usr/lib/python3.11",
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3.11/dist-packages",
)
# Not needed at run time; /usr/share/doc/*/copyright stays (licences).
TRIMMED = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log", "usr/share/man",
           "usr/share/info", "usr/share/lintian", "usr/share/locale", "usr/share/doc")  # fmt: skip


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a step; on failure the error carries its output (the logs are the diagnosis)."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Base:
    """A debootstrapped rootfs with `packages` added; cached under its key, with the resolved
    package versions (packages.txt) that go into every image key built on it."""

    packages: tuple[str, ...]

    @property
    def key(self) -> str:
        settings = f"{SUITE} {MIRROR} {VARIANT} {' '.join(sorted(self.packages))}".encode()
        return inputs_hash([("debootstrap", settings), ("trim", " ".join(TRIMMED).encode())])[:16]

    @property
    def path(self) -> Path:
        return cache_root() / "bases" / self.key

    def ensure(self, log: Sequence[str] = ()) -> Path:
        """The cached base (rootfs/ and packages.txt), bootstrapped if absent."""
        if not self.path.is_dir():
            with atomic_path(self.path) as tmp:
                tmp.mkdir()
                rootfs = tmp / "rootfs"
                debs = cache_root() / "debs"
                debs.mkdir(parents=True, exist_ok=True)
                # --force-check-gpg: a missing keyring fails the build instead of a warning.
                run("debootstrap", f"--variant={VARIANT}", "--force-check-gpg", f"--cache-dir={debs}",
                    f"--include={','.join(sorted(self.packages))}", SUITE, rootfs, MIRROR)  # fmt: skip
                versions = run(
                    "chroot", rootfs, "dpkg-query", "-W", "-f=${Package} ${Version}\\n", env=CHROOT_ENV
                )
                (tmp / "packages.txt").write_text(versions.stdout)
                trim(rootfs)
        return self.path

    def packages_txt(self) -> bytes:
        return (self.path / "packages.txt").read_bytes()

    def copy_to(self, dest: Path) -> Path:
        """A private copy of the rootfs to build on (the cached one stays pristine)."""
        run("cp", "-a", "--reflink=auto", self.path / "rootfs", dest)
        return dest


def trim(rootfs: Path) -> None:
    """Drop what a runtime image never reads: package caches, docs, man pages, the bytecode
    Debian's packages wrote (compile_bytecode writes it again, the same on every build; the
    Dockerfiles set PYTHONDONTWRITEBYTECODE=1, so a pod writes none)."""
    for rel in TRIMMED:
        for path in (rootfs / rel).glob("*"):
            if rel == "usr/share/doc" and (path / "copyright").is_file():
                for extra in path.iterdir():
                    if extra.name != "copyright":
                        remove(extra)
            else:
                remove(path)
    for cache in list(rootfs.glob("usr/**/__pycache__")):
        shutil.rmtree(cache)


def compile_bytecode(rootfs: Path, *directories: str) -> None:
    """Bytecode for every module under `directories` (PYTHON_PATHS: all of the image's Python), by
    the image's own python3, so that no process in a pod compiles what it imports (the serving
    pod's Python processes each spent 2 to 4 s of CPU on it: images/README.md, "Bytecode").
    Unchecked hash-based .pyc files (PEP 552): no timestamps in them, and never checked against
    the source, which an image never changes. sympy (81 MB of bytecode, torch imports it only to trace)
    and test suites are left out."""
    run("chroot", rootfs, "/usr/bin/python3", "-m", "compileall", "-q", "-j", "0",
        "--invalidation-mode", "unchecked-hash", "-x", "/(sympy|tests?)/", *directories,
        env=CHROOT_ENV)  # fmt: skip


def add_nonroot_user(rootfs: Path, shell: str = "/usr/sbin/nologin") -> None:
    """passwd/group entries for uid 65532 (getpass and `id` want one) and its home. `shell`: a real
    one where mpirun runs as this user (it writes remote commands in that shell's syntax)."""
    with (rootfs / "etc/passwd").open("a") as passwd:
        passwd.write(f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:{shell}\n")
    with (rootfs / "etc/group").open("a") as group:
        group.write(f"nonroot:x:{NONROOT}:\n")
    home = rootfs / "home/nonroot"
    home.mkdir(parents=True, exist_ok=True)
    shutil.chown(home, NONROOT, NONROOT)


def wheelhouse() -> Path:
    path = cache_root() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def download(lock: Path) -> None:
    """Fetch the lock's wheels into the shared wheelhouse (pip skips those already there), each
    checked against the lock's hashes. The host's python is 3.11 on glibc 2.36 too, so it picks
    the wheels the rootfs's python3 accepts."""
    run(sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--no-deps",
        "--require-hashes", "--dest", wheelhouse(), "-r", lock)  # fmt: skip


def pip_install(rootfs: Path, lock: Path) -> None:
    """Exactly the lock's wheels (--no-deps), offline from the wheelhouse, hash-checked again there:
    the wheelhouse is a cache shared by builds."""
    _chroot_pip(rootfs, lock, "--require-hashes", "--no-deps", "-r", f"{_TOOLS}/{lock.name}")


def pip_install_wheel(rootfs: Path, wheel: Path) -> None:
    """A wheel built in this build (our package) without its dependencies, which come from a lock:
    apart from the lock's install, since hash-checking mode would demand a hash for it too."""
    _chroot_pip(rootfs, wheel, "--no-deps", f"{_TOOLS}/{wheel.name}")


_TOOLS = "/tmp/build-tools"


def _chroot_pip(rootfs: Path, file: Path, *args: str) -> None:
    """pip (this interpreter's own copy, not left behind) inside the chroot, offline from the
    wheelhouse, with `file` copied in; Debian's python3 then owns the paths
    (/usr/local/lib/python3.11/dist-packages)."""
    import pip  # the host's pip, copied in: Debian's python3 has none and needs none at run time

    tools = rootfs / _TOOLS.lstrip("/")
    shutil.copytree(Path(pip.__file__).parent, tools / "pip")
    shutil.copytree(wheelhouse(), tools / "wheels", copy_function=_link_or_copy)
    shutil.copy(file, tools / file.name)
    try:
        run("chroot", rootfs, "/usr/bin/python3", "-m", "pip", "install", "--quiet", "--no-index",
            "--find-links", f"{_TOOLS}/wheels", "--no-compile", "--break-system-packages",
            "--root-user-action=ignore", "--disable-pip-version-check", *args,
            env={**CHROOT_ENV, "PYTHONPATH": _TOOLS})  # fmt: skip
    finally:
        shutil.rmtree(tools)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        Path(dst).hardlink_to(src)
    except OSError:
        shutil.copy2(src, dst)
