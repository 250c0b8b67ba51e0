"""The OCI archive writer and reader, and the cache's keys and atomic writes: pure, run anywhere."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from images.builder import images as specs
from images.builder.cache import atomic_path, inputs_hash
from images.builder.dockerfile import runtime_config
from images.builder.oci import (
    CONTAINERD_NAME,
    REF_NAME,
    ImageConfig,
    read_archive,
    unpack,
    write_archive,
    write_layer,
)

REFS = ["localhost/llm-operator/demo:dev-0123456789ab", "localhost/llm-operator/demo:dev"]
CONFIG = ImageConfig(
    entrypoint=["/bin/app"],
    cmd=["serve"],
    env={"A": "1"},
    user="65532:65532",
    workdir="/work",
    labels={"x": "y"},
)


def make_tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin/app").write_bytes(b"#!/bin/sh\necho hi\n")
    (root / "bin/app").chmod(0o755)
    (root / "bin/alias").symlink_to("app")
    (root / "bin/hard").hardlink_to(root / "bin/app")
    (root / "etc").mkdir()
    (root / "etc/conf").write_text("z" * 10_000)
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
    (root / "tmp/leftover").write_text("runtime state")
    return root


def build(tmp_path: Path, name: str = "image.tar") -> Path:
    layer = write_layer(make_tree(tmp_path / f"rootfs-{name}"), tmp_path / f"layer-{name}.gz")
    write_archive(tmp_path / name, REFS, CONFIG, [layer], history="test")
    return tmp_path / name


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_layout_digests_and_annotations(tmp_path: Path) -> None:
    files = members(build(tmp_path))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():  # content addressed: every blob's name is its sha256
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    assert [m["annotations"][CONTAINERD_NAME] for m in index["manifests"]] == REFS
    assert [m["annotations"][REF_NAME] for m in index["manifests"]] == ["dev-0123456789ab", "dev"]
    assert len({m["digest"] for m in index["manifests"]}) == 1
    manifest = json.loads(files[f"blobs/sha256/{index['manifests'][0]['digest'].split(':')[1]}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert manifest["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(gzip.decompress(layer)).hexdigest()}"]
    assert config["config"] == {
        "Entrypoint": ["/bin/app"],
        "Cmd": ["serve"],
        "Env": ["A=1"],
        "User": "65532:65532",
        "WorkingDir": "/work",
        "Labels": {"x": "y"},
    }


def test_layer_round_trip(tmp_path: Path) -> None:
    image = read_archive(build(tmp_path))
    assert image.refs == REFS
    out = tmp_path / "out"
    unpack(image, out)
    assert (out / "bin/app").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (out / "bin/app").stat().st_mode & 0o777 == 0o755
    assert os.readlink(out / "bin/alias") == "app"
    assert (out / "bin/hard").stat().st_ino == (out / "bin/app").stat().st_ino
    assert (out / "etc/conf").read_text() == "z" * 10_000
    # Runtime directories ship empty, with their modes.
    assert (out / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert not (out / "tmp/leftover").exists()


def test_layers_are_deterministic(tmp_path: Path) -> None:
    """Same tree, different times and build dirs -> same bytes; so same content keeps its digest."""
    first = members(build(tmp_path, "a.tar"))
    os.utime(tmp_path / "rootfs-a.tar/etc/conf", (1, 1))
    assert members(build(tmp_path, "b.tar")) == first


def test_reader_rejects_a_corrupted_blob(tmp_path: Path) -> None:
    files = members(build(tmp_path))
    layer_name = next(n for n, d in files.items() if n.startswith("blobs/") and d[:2] == b"\x1f\x8b")
    files[layer_name] = files[layer_name][:-1] + bytes([files[layer_name][-1] ^ 1])
    broken = tmp_path / "broken.tar"
    with tarfile.open(broken, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match="does not match"):
        read_archive(broken)


def test_atomic_write_leaves_nothing_when_interrupted(tmp_path: Path) -> None:
    dest = tmp_path / "out.tar"

    def interrupted_build() -> None:
        with atomic_path(dest) as tmp:
            tmp.write_bytes(b"half an archive")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_build()
    assert list(tmp_path.iterdir()) == []
    with atomic_path(dest) as tmp:
        tmp.write_bytes(b"whole")
    assert dest.read_bytes() == b"whole"
    assert list(tmp_path.iterdir()) == [dest]


def test_inputs_hash_changes_with_any_input() -> None:
    base = [("operator/a.py", b"x = 1"), ("debian", b"python3 3.11.2-1")]
    assert inputs_hash(base) == inputs_hash(list(reversed(base)))
    assert inputs_hash(base) != inputs_hash([("operator/a.py", b"x = 2"), base[1]])
    assert inputs_hash(base) != inputs_hash([("operator/b.py", b"x = 1"), base[1]])
    assert inputs_hash(base) != inputs_hash([*base, ("new", b"")])
    # Name/content boundaries cannot be shifted to collide.
    assert inputs_hash([("ab", b"c")]) != inputs_hash([("a", b"bc")])


def test_image_key_covers_its_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An edited project file, Dockerfile or builder module gives a new archive name."""
    checkout = tmp_path / "checkout"
    for rel in ("images/pause/pause.c", "images/builder/oci.py"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text("v1")
    monkeypatch.setattr(specs, "REPO", checkout)
    monkeypatch.setattr(specs, "_tool_version", lambda *command: b"12.2.0")  # gcc, libc6-dev
    spec = specs.SPECS["pause"]
    first = specs.inputs_digest(spec)
    assert specs.inputs_digest(spec) == first
    (checkout / "images/pause/pause.c").write_text("v2")
    second = specs.inputs_digest(spec)
    (checkout / "images/builder/oci.py").write_text("v2")
    third = specs.inputs_digest(spec)
    assert len({first, second, third}) == 3
    (checkout / "images/builder/__pycache__").mkdir()
    (checkout / "images/builder/__pycache__/oci.cpython-311.pyc").write_text("by-product")
    assert specs.inputs_digest(spec) == third


def test_config_follows_the_dockerfile() -> None:
    """The local image runs as the published one: entry point, user, env (paths translated)."""
    config = runtime_config(specs.REPO / "images/cpu-runtime.Dockerfile", specs.SITE_PACKAGES)
    assert config.entrypoint == [], "no launcher in it: the pod's init container copies one in"
    assert config.user == "65532:65532"
    assert config.workdir == "/"
    assert config.env["LLMOP_BACKEND"] == "cpu-reference"
    assert config.env["LLMOP_TRITONSERVER"].startswith("/usr/local/lib/python3.11/dist-packages/pytriton/")
    assert not any("site-packages" in v for v in config.env.values())
    operator = runtime_config(specs.REPO / "images/operator.Dockerfile")
    assert (operator.entrypoint, operator.cmd) == (["llm-operator"], ["run", "--all-namespaces"])
    assert not any(k.startswith("LLMOP_") for k in operator.env), "templates are package data"


def test_a_step_above_a_base_ships_only_what_it_wrote(tmp_path: Path) -> None:
    """The cpu-runtime image's two layers: the cached base, then only what our package added."""
    root = make_tree(tmp_path / "rootfs")
    base = write_layer(root, tmp_path / "base.gz")
    below = specs._tree(root)
    (root / "usr/lib/app").mkdir(parents=True)
    (root / "usr/lib/app/module.py").write_text("x = 1\n")
    (root / "etc/conf").write_text("changed")
    added = specs._added(root, below)
    assert root / "usr/lib/app/module.py" in added and root / "usr" in added, "with its parents"
    assert root / "bin/app" not in added and root not in added
    top = write_layer(root, tmp_path / "top.gz", only=added)
    write_archive(tmp_path / "two.tar", REFS, CONFIG, [base, top], history="test")
    image = read_archive(tmp_path / "two.tar")
    assert len(image.manifest["layers"]) == len(image.config["history"]) == 2
    unpack(image, tmp_path / "out")
    assert (tmp_path / "out/usr/lib/app/module.py").read_text() == "x = 1\n"
    assert (tmp_path / "out/etc/conf").read_text() == "changed" and (tmp_path / "out/bin/app").is_file()
    assert top.size < base.size

    (root / "bin/alias").unlink()
    with pytest.raises(RuntimeError, match="removed base files: \\['bin/alias'\\]"):
        specs._added(root, below)
