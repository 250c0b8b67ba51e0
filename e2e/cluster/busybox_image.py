"""A one-layer OCI image archive holding Debian's busybox-static, written on the fly.

Stands in where no project image is at hand: the real node's sandbox (pause) image while
images.builder is absent, and the tests' tiny web server. Archives are written to a temporary
place (never committed), pushed to the test registry and pulled by the node's containerd by
name (`io.containerd.image.name`), so pods use them with `imagePullPolicy: IfNotPresent` or `Never`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "httpd", "nslookup", "wget", "cat", "echo", "mkdir", "nc", "ls", "hostname")


def _blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':')[1]}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return digest, len(data)


def _layer() -> tuple[bytes, str]:
    """(gzip layer, diff id): /bin/busybox, applet links, /tmp, /etc/passwd."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("bin", "tmp", "etc", "www"):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(d)
        data = BUSYBOX.read_bytes()
        f = tarfile.TarInfo("bin/busybox")
        f.size, f.mode = len(data), 0o755
        tar.addfile(f, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for name, text in (
            ("etc/passwd", "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"),
            ("www/index.html", "ok\n"),
        ):
            body = text.encode()
            f = tarfile.TarInfo(name)
            f.size, f.mode = len(body), 0o644
            tar.addfile(f, io.BytesIO(body))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    return gzip.compress(raw.getvalue(), mtime=0), diff_id


def write(dest: Path, ref: str, entrypoint: Sequence[str]) -> Path:
    """Write the archive for image `ref` (e.g. localhost/llm-operator/busybox:test) to `dest`."""
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} missing (Debian package busybox-static)")
    layer, diff_id = _layer()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w") as tar:
        layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
        info = tarfile.TarInfo("oci-layout")
        info.size = len(layout)
        tar.addfile(info, io.BytesIO(layout))
        layer_digest, layer_size = _blob(tar, layer)
        config_digest, config_size = _blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        manifest_digest, manifest_size = _blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "annotations": {"io.containerd.image.name": ref},
                }
            ],
        }
        body = json.dumps(index).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return dest
