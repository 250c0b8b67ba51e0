"""Run a built image without a container runtime: unpack its archive through the OCI reader (so
the layout under test is what a runtime would get) and run its processes chrooted, as the image's
user and environment, in private mount and PID namespaces (the process is PID 1 as in a pod, and
/proc, /dev and /dev/shm vanish with it: nothing to clean up on the host)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from images.builder.oci import read_archive, unpack

# Mounted in the namespace before chroot: what a runtime gives every container.
SETUP = """
set -e
mount -t proc proc "$ROOT/proc"
mount -t tmpfs -o mode=0755 tmpfs "$ROOT/dev"
for node in null zero random urandom; do
  touch "$ROOT/dev/$node"
  mount --bind "/dev/$node" "$ROOT/dev/$node"
done
mkdir "$ROOT/dev/shm"; mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
exec chroot --userspec="$USERSPEC" --groups="${USERSPEC#*:}" "$ROOT" "$@"
"""


@dataclass(frozen=True)
class Rootfs:
    path: Path
    config: dict[str, Any]  # the image config's "config" object

    @classmethod
    def unpack(cls, archive: Path, dest: Path) -> Rootfs:
        image = read_archive(archive)
        unpack(image, dest)
        return cls(dest, image.config["config"])

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config["Env"])

    def command(self, *args: str) -> list[str]:
        """Entrypoint + args, as `docker run IMAGE args` would run (Cmd when no args)."""
        return [*self.config["Entrypoint"], *(args or self.config.get("Cmd") or [])]

    def popen(
        self, argv: list[str], env: dict[str, str] | None = None, **kwargs: object
    ) -> subprocess.Popen[str]:
        user = str(self.config.get("User") or "0:0")
        if ":" not in user:
            user = f"{user}:{user}"
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            [
                "unshare",
                "--mount",
                "--propagation=private",
                "--pid",
                "--fork",
                "--kill-child",
                "sh",
                "-c",
                SETUP,
                "sh",
                *argv,
            ],
            env={**self.env, **(env or {}), "ROOT": str(self.path), "USERSPEC": user},
            text=True,
            **kwargs,
        )

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        with self.popen(argv, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
            out, _ = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, process.returncode, out)


def pid_one(unshare_pid: int) -> int:
    """The host pid of the namespace's PID 1 (unshare --fork's child)."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def can_build() -> str | None:
    """Why these tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "building and chrooting into images needs root"
    for tool in ("debootstrap", "gcc", "unshare", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/ensure-system-packages.sh installs it)"
    return None
