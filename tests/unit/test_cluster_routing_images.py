"""The router's images in the test world (e2e/cluster/routing.py), written around a real dynamically
linked program (/bin/true stands in for Envoy, a static copy for the EPP) into a private image
cache: upstream's names, entrypoints and user, every shared object the program loads, and reuse
keyed by the inputs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2e.cluster import routing
from images.builder import oci

PROGRAM = Path("/bin/true")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMOP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _binary(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    shutil.copy2(PROGRAM, path)
    return path


def _unpacked(archive: Path, dest: Path) -> tuple[oci.Image, Path]:
    image = oci.read_archive(archive)  # checks every blob against its digest
    oci.unpack(image, dest)
    return image, dest


def test_envoy_image_is_upstreams_distroless_layout_with_the_glibc_it_loads(
    cache: Path, tmp_path: Path
) -> None:
    envoy = _binary(tmp_path, "envoy")
    image, root = _unpacked(routing.archive("envoy", envoy, lambda _: None), tmp_path / "root")
    assert image.refs == [routing.ENVOY_IMAGE] == ["docker.io/envoyproxy/envoy:distroless-v1.40.0"]
    config = image.config["config"]
    assert config["Entrypoint"] == ["/usr/local/bin/envoy"]
    assert config["Cmd"] == ["-c", "/etc/envoy/envoy.yaml"]
    assert config["User"] == "65532"
    assert (root / "usr/local/bin/envoy").read_bytes() == PROGRAM.read_bytes()
    assert os.access(root / "usr/local/bin/envoy", os.X_OK)
    loaded = routing.shared_objects(envoy)
    assert any(p.name.startswith("ld-linux") for p in loaded) and any(p.name == "libc.so.6" for p in loaded)
    for path in loaded:
        assert (root / str(path).lstrip("/")).read_bytes() == path.read_bytes()
    assert "nonroot:x:65532:65532:" in (root / "etc/passwd").read_text()
    assert (root / "etc/envoy/envoy.yaml").is_file()
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_epp_image_is_upstreams_layout(cache: Path, tmp_path: Path) -> None:
    epp = _binary(tmp_path, "epp")
    image, root = _unpacked(routing.archive("epp", epp, lambda _: None), tmp_path / "root")
    assert image.refs == [routing.EPP_IMAGE] == ["registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"]
    assert image.config["config"]["Entrypoint"] == ["/epp"]
    assert "Cmd" not in image.config["config"]
    assert image.config["config"]["User"] == "65532"
    assert (root / "epp").read_bytes() == PROGRAM.read_bytes()
    assert not (root / "lib64").exists(), "the EPP is static: no loader, no glibc"


def test_archives_are_reused_until_an_input_changes(cache: Path, tmp_path: Path) -> None:
    envoy = _binary(tmp_path, "envoy")
    logged: list[str] = []
    first = routing.archive("envoy", envoy, logged.append)
    written = first.stat().st_mtime_ns
    assert routing.archive("envoy", envoy, logged.append) == first
    assert first.stat().st_mtime_ns == written and len(logged) == 1
    envoy.write_bytes(envoy.read_bytes() + b"\0")  # a rebuilt binary
    second = routing.archive("envoy", envoy, logged.append)
    assert second != first and len(logged) == 2
    assert first.parent == cache / "images"
