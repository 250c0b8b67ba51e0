"""The test registry's configuration as containerd reads it, and the names images are pushed under
(the registry itself runs in tests/e2e/test_registry.py and test_release.py)."""

from __future__ import annotations

import base64
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from e2e.cluster import busybox_image, pki, registry
from images.push import manifest_digest, project_version, repository

REPO = Path(__file__).resolve().parents[2]


def test_hosts_files_trust_the_ca_and_only_mirrors_carry_the_nodes_credentials(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    registry.write_hosts(tmp_path / "certs.d", ca, "the-node-password")
    mirror = f"https://{registry.HOST}"
    found = {}
    for path in (tmp_path / "certs.d").glob("*/hosts.toml"):
        found[path.parent.name] = tomllib.loads(path.read_text())
        assert path.stat().st_mode & 0o777 == 0o600, "the node's Basic header: its owner's alone"
    assert set(found) == {registry.HOST, *registry.MIRRORED}
    for host, config in found.items():
        # containerd 1.6.20 refuses a file without a [host] table and then ignores its CA.
        entry = config["host"][mirror]
        assert entry["ca"] == str(ca) and entry["capabilities"] == ["pull", "resolve"]
        header = entry.get("header", {})
        if host == registry.HOST:  # the pod's pull secret, nothing else
            assert config["server"] == mirror and header == {}
        else:
            assert config["server"] == registry.MIRRORED[host]
            user, _, password = base64.b64decode(header["Authorization"].removeprefix("Basic ")).partition(
                b":"
            )
            assert (user.decode(), password.decode()) == (registry.NODE_USER, "the-node-password")


def test_a_private_file_is_its_owners_alone_also_when_it_replaces_a_readable_one(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("old")
    path.chmod(0o644)
    pki.write_private(path, '{"auths": {}}')
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == '{"auths": {}}'
    pki.write_private(tmp_path / "new.key", b"key")
    assert (tmp_path / "new.key").stat().st_mode & 0o777 == 0o600


def test_each_up_makes_new_passwords_kept_from_other_users_and_htpasswd_checks_them(tmp_path: Path) -> None:
    first = registry.new_passwords(tmp_path)
    assert (tmp_path / registry.PASSWORDS).stat().st_mode & 0o777 == 0o600
    assert registry.passwords(tmp_path) == first
    second = registry.new_passwords(tmp_path)
    assert registry.passwords(tmp_path) == second and len({first.push, first.node, second.push}) == 3
    registry.htpasswd(tmp_path / "htpasswd", second)
    for user, password, ok in ((registry.PUSH_USER, second.push, 0), (registry.NODE_USER, second.node, 0),
                               (registry.PUSH_USER, first.push, 3)):  # fmt: skip
        verify = ["htpasswd", "-vi", str(tmp_path / "htpasswd"), user]
        assert subprocess.run(verify, input=password, capture_output=True, text=True).returncode == ok
    assert second.push not in (tmp_path / "htpasswd").read_text()


def test_default_and_builder_names_resolve_to_the_paths_pushed() -> None:
    refs = registry.push_refs(
        ["localhost/llm-operator/operator:dev-0123456789ab", "localhost/llm-operator/operator:dev"], "0.1.0"
    )
    assert refs == [
        f"{registry.HOST}/llm-operator/operator:dev-0123456789ab",
        f"{registry.HOST}/llm-operator/operator:dev",
        f"{registry.HOST}/llm-operator/llm-operator/operator:0.1.0",
    ]
    # What containerd asks the mirror for the operator's default name is among them.
    assert registry.local_name("ghcr.io/llm-operator/llm-operator/operator:0.1.0") in refs
    # The launcher carries its default name, tagged by content: no version tag of it.
    launcher = ["localhost/llm-operator/launcher:dev", "localhost/llm-operator/launcher:0123abcd",
                "ghcr.io/llm-operator/llm-operator/launcher:0123abcd"]  # fmt: skip
    assert registry.push_refs(launcher, "0.1.0") == [
        f"{registry.HOST}/llm-operator/launcher:dev",
        f"{registry.HOST}/llm-operator/launcher:0123abcd",
        f"{registry.HOST}/llm-operator/llm-operator/launcher:0123abcd",
    ]
    assert registry.default_refs(launcher, "0.1.0") == []
    assert registry.push_refs(["docker.io/envoyproxy/envoy:distroless-v1.40.0"], "0.1.0") == [
        f"{registry.HOST}/envoyproxy/envoy:distroless-v1.40.0"
    ]
    with pytest.raises(ValueError, match="not under a mirrored registry"):
        registry.local_name("quay.io/org/image:1")


def test_repository_keeps_a_port_and_drops_the_tag() -> None:
    assert (
        repository("10.240.0.10:5000/llm-operator/operator:dev") == "10.240.0.10:5000/llm-operator/operator"
    )
    assert repository("10.240.0.10:5000/llm-operator/operator") == "10.240.0.10:5000/llm-operator/operator"


def test_manifest_digest_is_the_archives_one_image(tmp_path: Path) -> None:
    archive = busybox_image.write(tmp_path / "bb.oci.tar", "localhost/llm-operator/busybox:e2e", ["/bin/sh"])
    digest = manifest_digest(archive)
    assert digest.startswith("sha256:") and len(digest) == 71


def test_release_refuses_a_version_that_is_not_the_projects() -> None:
    proc = subprocess.run(
        ["scripts/release.sh", "registry.example/team", "9.9.9"],
        capture_output=True, text=True, cwd=REPO, env={"PY": sys.executable, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"VERSION 9.9.9 is not the project's version {project_version()}" in proc.stderr


def test_default_names_are_the_operators_defaults_of_builder_images() -> None:
    from llm_operator.images import DEFAULT_OPERATOR_IMAGE

    names = ["localhost/llm-operator/operator:dev-0123456789ab", "localhost/llm-operator/operator:dev"]
    assert registry.default_refs(names, project_version()) == [DEFAULT_OPERATOR_IMAGE]
    assert registry.default_refs(["docker.io/envoyproxy/envoy:distroless-v1.40.0"], "0.1.0") == []
