"""The launcher image: exactly the files the operator injects into serving pods and build Jobs
(llm_operator/inject.py sources(): the operator's, and the libraries the front door needs from this
environment, under inject.LAUNCHER_SOURCE) and Debian's static busybox, which copies them into the
pod's emptyDir (inject.copy_command; render/inject.py runs it as the init container). No Python, no
shell beyond busybox's applets, nothing else of the operator. For its SBOM (images/sbom.py) and
scanners, busybox's dpkg status paragraph and the builder's os-release name it as the Debian package
it is, as distroless images do; the shipped libraries carry their dist-info METADATA (inject.py).

Tagged with inject.content_tag() of the checkout's package, the function the operator applies to
its own installed package to name the image it runs (llm_operator/images.py launcher_image), so
both agree, and a release whose injected files are unchanged publishes the tag the previous one did.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from llm_operator import inject
from llm_operator.render.inject import INJECT_PATH

from images.builder.oci import ImageConfig

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "llm_operator"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (scripts/ensure-system-packages.sh)
OS_RELEASE = Path("/etc/os-release")
DPKG_STATUS = "var/lib/dpkg/status"
# Non-root by default; in a pod it runs as the pod's user (restricted), which only needs to read.
USER = "65532:65532"


def tag() -> str:
    return inject.content_tag(PACKAGE)


def busybox_status() -> bytes:
    """busybox-static's paragraph of this machine's dpkg status database (its version included)."""
    return subprocess.run(["dpkg-query", "-s", "busybox-static"], capture_output=True, check=True).stdout


def inputs() -> list[tuple[str, bytes]]:
    # The operator's files from the checkout, h11's from this environment (inject.LIBRARIES).
    return [("busybox-static", busybox_status()), ("os-release", OS_RELEASE.read_bytes()),
            *((rel, p.read_bytes()) for rel, p in inject.sources(PACKAGE))]  # fmt: skip


def assemble(rootfs: Path, work: Path) -> ImageConfig:
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} missing (Debian package busybox-static)")
    rootfs.mkdir()
    shutil.copyfile(BUSYBOX, rootfs / inject.COPIER.lstrip("/"))
    (rootfs / inject.COPIER.lstrip("/")).chmod(0o755)
    (rootfs / DPKG_STATUS).parent.mkdir(parents=True)
    (rootfs / DPKG_STATUS).write_bytes(busybox_status())
    (rootfs / "etc").mkdir()
    (rootfs / "etc/os-release").write_bytes(OS_RELEASE.read_bytes())
    inject.copy(rootfs / inject.LAUNCHER_SOURCE.lstrip("/"), PACKAGE)
    *copier, dest = inject.copy_command(INJECT_PATH)
    return ImageConfig(entrypoint=copier, cmd=[dest], user=USER)
