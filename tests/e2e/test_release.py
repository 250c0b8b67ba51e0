"""The release workflow's steps (.github/workflows/release.yml runs scripts/release.sh after the
tests) against the test world's registry instead of ghcr.io: the images and the chart are pushed,
then the chart is installed from the pushed OCI chart with default values, and its operator,
pulled by its default name (`ghcr.io/llm-operator/llm-operator/operator:<appVersion>`, which the node's
containerd mirrors to the test registry), serves a cpu-reference deployment whose runtime is the
default `ghcr.io/llm-operator/llm-operator/cpu-runtime:<appVersion>`: what a user of the published chart gets.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from e2e.cluster import netns, registry
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, pod_ready, wait_for
from images.push import manifest_digest, project_version
from tests.e2e.operator_fixtures import OperatorProcess
from tests.e2e.test_chart_install import TIMEOUT, Helm, serve_from_the_pod

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def inside(ns: str, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` in the cluster's network namespace (where the registry listens), with `env` added."""
    command = netns.command(ns, ["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_release_script_publishes_what_the_default_chart_installs(
    crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    launcher = cluster.launcher
    if launcher is None:
        pytest.skip("needs the embedded cluster's registry")
    helm = Helm(cluster)
    version = project_version()
    from images.builder.images import SPECS, build

    # Built here first: a build downloads from Debian's mirror and PyPI, which the namespace the
    # script runs in (to reach the registry) cannot; the script's own build step then reuses them.
    for name in SPECS:
        build(name, log=lambda line: None)
    # The workflow's step, run inside the cluster's namespace (where the registry is), with the
    # test registry's account and CA in place of `crane auth login ghcr.io`.
    env = {**launcher.registry_env, "HELM": helm.argv[0], "PY": sys.executable}
    run = inside(launcher.netns, env, str(REPO / "scripts" / "release.sh"), registry.PREFIX, version)
    assert run.returncode == 0, run.stderr[-3000:]
    chart_ref = f"oci://{registry.PREFIX}/charts/llm-operator"
    assert run.stdout.strip().splitlines()[-1] == f"{chart_ref}:{version}", run.stdout
    crane = launcher.registry_crane()
    archives = [build(name, log=lambda line: None) for name in SPECS]
    for name, archive in zip(SPECS, archives, strict=True):
        assert crane.check("digest", f"{registry.PREFIX}/{name}:{version}") == manifest_digest(archive), name
    # The version tag moves with every rebuild in the test world (never in a real release): what
    # `make images` does here drops the node's copies of an older build.
    pushed = launcher.push_images(archives)
    assert all(f":{version}" not in ref for ref in pushed), "the script pushed the version tags"

    # What a user does: install the published chart by its OCI reference, default values.
    pulled = inside(launcher.netns, launcher.registry_env, helm.argv[0], "pull", chart_ref,
                    "--version", version, "-d", str(tmp_path))  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    package = tmp_path / f"llm-operator-{version}.tgz"
    with tarfile.open(package) as tar:
        member = tar.extractfile("llm-operator/Chart.yaml")
        assert member is not None
        assert yaml.safe_load(member)["appVersion"] == version
    name = f"llmop-{secrets.token_hex(3)}"
    try:
        helm("install", name, str(package), "--namespace", namespace, "--wait", f"--timeout={TIMEOUT}s")
        pods = kubectl.items("pods", namespace, f"app.kubernetes.io/instance={name}")
        assert pods and all(pod_ready(p) for p in pods)
        for pod in pods:  # pulled by the default name, through the mirror, as this very image
            assert (
                pod["spec"]["containers"][0]["image"]
                == f"ghcr.io/llm-operator/llm-operator/operator:{version}"
            )
            (status,) = pod["status"]["containerStatuses"]  # its image: one of the image's names
            assert status["imageID"].endswith(manifest_digest(build("operator", log=lambda line: None)))
        held = wait_for(
            "the Lease held",
            lambda: kubectl.get("lease", f"{name}-llm-operator", namespace),
            lambda o: bool(o and o["spec"].get("holderIdentity")),
            timeout=TIMEOUT,
        )
        serve_from_the_pod(kubectl, namespace, namespace, held["spec"]["holderIdentity"])  # type: ignore[index]
    finally:
        subprocess.run([*helm.argv, "uninstall", name, "--namespace", namespace, "--ignore-not-found"],
                       capture_output=True, timeout=TIMEOUT)  # fmt: skip


def test_llm_operator_run_with_its_default_images_serves_on_the_real_node(
    crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """`llm-operator run` from the host as the README offers it, no image configured: its serving
    pods name `ghcr.io/llm-operator/llm-operator/{operator,cpu-runtime}:<version>`, which the node pulls
    through its mirror of ghcr.io (before the registry, they stayed in ImagePullBackOff)."""
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's registry")
    op = OperatorProcess(cluster, tmp_path / "operator.log", ("--namespace", namespace))
    op.stop()
    for var in ("LLMOP_CPU_RUNTIME_IMAGE", "LLMOP_OPERATOR_IMAGE", "LLMOP_MULTI_NODE_RUNTIME_IMAGE"):
        op.env.pop(var)
    op.start()
    try:
        op.wait_healthy()
        manifest = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
        manifest["spec"]["resources"]["cpu"] = "250m"
        kubectl.apply(manifest, namespace=namespace)
        wait_for(
            "tiny-llama Ready",
            lambda: kubectl.get("llmdeployment", "tiny-llama", namespace),
            lambda o: is_true(o, "Ready"),
            timeout=TIMEOUT,
        )
        (pod,) = kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")
        version = project_version()
        assert (
            pod["spec"]["initContainers"][0]["image"]
            == f"ghcr.io/llm-operator/llm-operator/operator:{version}"
        )
        assert (
            pod["spec"]["containers"][0]["image"]
            == f"ghcr.io/llm-operator/llm-operator/cpu-runtime:{version}"
        )
        kubectl("delete", "llmdeployment", "tiny-llama", "--wait=true", namespace=namespace)
    finally:
        op.stop()
