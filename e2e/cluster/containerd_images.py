"""The real node's images: ctr on its containerd, pulls from the test registry through containerd's
registry host configuration, and what `up` does to the kept containerd root (node.py) before the
kubelet starts: the old pods' containers removed, the images every pod runs pulled, old builds
dropped.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from e2e.cluster import busybox_image, netns
from e2e.cluster.node import NodeLayout

# The busybox stand-in for the pause image while images.builder is not there.
FALLBACK_PAUSE = "localhost/llm-operator/pause:busybox"


def ctr(
    layout: NodeLayout, *args: str, timeout: float = 300, netns_name: str | None = None
) -> subprocess.CompletedProcess[str]:
    """ctr on the node's containerd; inside network namespace `netns_name` for what reaches a
    registry (ctr fetches as containerd's client)."""
    argv = ["ctr", "--address", str(layout.socket), "--namespace", "k8s.io", *args]
    return subprocess.run(
        netns.command(netns_name, argv) if netns_name else argv,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pull_image(layout: NodeLayout, netns_name: str, ref: str) -> None:
    """Pull `ref` from the test registry as a pod's pull would find it: through containerd's
    registry host configuration (certs.d: the mirrors, the CA, the node's credentials)."""
    proc = ctr(layout, "images", "pull", "--hosts-dir", str(layout.certs_d), ref, netns_name=netns_name)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(f"ctr images pull {ref}: {lines[-1] if lines else f'exit {proc.returncode}'}")


def image_names(archive: Path) -> list[str]:
    return list(archive_refs(archive))


def archive_refs(archive: Path) -> dict[str, str]:
    """The image names an OCI archive carries -> the digest each names."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return {
        m["annotations"]["io.containerd.image.name"]: m["digest"]
        for m in index.get("manifests", [])
        if "io.containerd.image.name" in m.get("annotations", {})
    }


def _ctr_lines(layout: NodeLayout, *args: str) -> list[str]:
    proc = ctr(layout, *args, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.splitlines()


def node_images(layout: NodeLayout) -> dict[str, str]:
    """Images in the node's containerd: name -> digest."""
    found = {}
    for line in _ctr_lines(layout, "images", "ls")[1:]:  # REF TYPE DIGEST SIZE PLATFORMS LABELS
        fields = line.split()
        if len(fields) >= 3:
            found[fields[0]] = fields[2]
    return found


def remove_old_pods(layout: NodeLayout) -> int:
    """Delete the containers (pods' and their sandboxes') a previous instance left in the kept
    containerd root, with containerd running without its CRI plugin; returns how many."""
    ids = _ctr_lines(layout, "containers", "ls", "-q")
    if ids:
        _ctr_lines(layout, "containers", "rm", *ids)
    return len(ids)


def pull_missing(
    layout: NodeLayout,
    netns_name: str,
    wanted: Mapping[str, str],
    log: Callable[[str], None],
    have: Mapping[str, str] | None = None,
) -> list[str]:
    """Pull (from the test registry, which must have them) each name of `wanted` (name -> digest)
    that the node lacks or has at another digest; `have`: the node's images if already listed.
    Returns the names pulled."""
    have = node_images(layout) if have is None else have
    pulled = [name for name, digest in wanted.items() if have.get(name) != digest]
    for name in pulled:
        start = time.monotonic()
        pull_image(layout, netns_name, name)
        log(f"real node: pulled {name} in {time.monotonic() - start:.1f} s")
    return pulled


def sync_images(
    layout: NodeLayout,
    netns_name: str,
    archives: Iterable[Path],
    keep_prefix: str,
    log: Callable[[str], None],
    aliases: Mapping[str, str] | None = None,
) -> list[str]:
    """Pull (from the test registry, which has them: `up` pushed them first) each name the archives
    carry that the node lacks or has at another digest, so that no test waits for a pull of the
    images every pod runs; remove images named under `keep_prefix` that no archive names (old
    builds) and CRI's `sha256:` names of images no archive holds, and `aliases` (more names of
    the archives' images, name -> digest) at another digest (drop_moved). Returns the names
    pulled."""
    have = node_images(layout)
    wanted: dict[str, str] = {}
    for archive in archives:
        wanted |= archive_refs(archive)
    pulled = pull_missing(layout, netns_name, wanted, log, have)
    # Older builds, and the sha256:<config> names CRI gave them (they would keep their content).
    digests = set(wanted.values())
    stale = [
        name
        for name, digest in have.items()
        if (name.startswith(keep_prefix) and name not in wanted)
        or (name.startswith("sha256:") and digest not in digests)
    ]
    if stale:
        _ctr_lines(layout, "images", "rm", *stale)
    drop_moved(layout, aliases or {})
    return pulled


def drop_moved(layout: NodeLayout, names: Mapping[str, str]) -> list[str]:
    """Remove the node's images named in `names` (name -> the registry's digest) at another digest:
    the kubelet then pulls the registry's (imagePullPolicy IfNotPresent would keep the old one).
    Their layers stay while another name holds them."""
    moved = [name for name, digest in node_images(layout).items() if names.get(name, digest) != digest]
    if moved:
        _ctr_lines(layout, "images", "rm", *moved)
    return moved


# Pushed to the test registry and pulled onto the real node at `up` (cached by inputs): from
# images.builder the sandbox, the operator (the chart's pod), the CPU runtime (cpu-reference
# serving pods), the fetch image (the model cache's fetch Jobs) and the launcher (every serving
# pod's init container, under its content tag); from routing.py the router pod's endpoint picker and
# Envoy, under their upstream names.
# The router's images (epp, envoy) come with the routing add-on (addons.py).
NODE_IMAGES = ("pause", "operator", "cpu-runtime", "fetch", "launcher")
LOCAL_REGISTRY = "localhost/llm-operator/"


def node_archives(
    scratch: Path, log: Callable[[str], None], images: Iterable[str] = NODE_IMAGES
) -> tuple[list[Path], str]:
    """The archives of `images` (built by images.builder unless cached) and the sandbox image's
    name; without images/builder in the tree only a busybox stand-in for pause."""
    try:
        from images.builder.images import build  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        path = busybox_image.write(scratch / "pause.oci.tar", FALLBACK_PAUSE, ["/bin/sleep", "2147483647"])
        return [path], FALLBACK_PAUSE
    archives = [build(name, log=log) for name in dict.fromkeys(["pause", *images])]
    names = image_names(archives[0])
    # The stable alias (":dev") if there is one, else the content-addressed tag.
    return archives, next((n for n in names if n.endswith(":dev")), names[0])
