"""The release workflow's steps (.github/workflows/release.yml's publish job runs scripts/release.sh)
against the test world's registry instead of ghcr.io, with a cosign key pair made here standing in
for the workflow's keyless identity: the images and the chart are pushed, signed and attested
(SBOM, provenance), and `cosign verify` accepts each by digest with that key and refuses another
key. Then the chart is installed from the pushed OCI chart with default values, and its operator,
pulled by its default name pinned to the pushed digest
(`ghcr.io/llm-operator/llm-operator/operator@sha256:...`, which the node's containerd mirrors to the
test registry), serves a cpu-reference deployment whose runtime is the default
`ghcr.io/llm-operator/llm-operator/cpu-runtime@sha256:...`: what a user of the published chart gets.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from e2e.cluster import netns, registry
from e2e.cluster.components import BUILD_TOOLS
from e2e.cluster.testing import E2ECluster, Kubectl, is_true, pod_ready, wait_for
from images.push import manifest_digest, project_version, published_tag
from tests.e2e.operator_fixtures import OperatorProcess
from tests.e2e.test_chart_install import TIMEOUT, Helm, serve_from_the_pod

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # runs the released operator
REPO = Path(__file__).resolve().parents[2]


def inside(ns: str, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` in the cluster's network namespace (where the registry listens), with `env` added."""
    command = netns.command(ns, ["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def cosign_binary() -> Path:
    """cosign, built (or reused from the cache) by build-tools.sh's release group."""
    proc = subprocess.run(["bash", str(BUILD_TOOLS), "release"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (cosign,) = [Path(d) / "cosign" for d in proc.stdout.split() if (Path(d) / "cosign").is_file()]
    return cosign


def key_pair(cosign: Path, directory: Path) -> tuple[Path, Path]:
    """A fresh cosign key pair (empty password) in `directory`: (private, public)."""
    directory.mkdir()
    made = subprocess.run([str(cosign), "generate-key-pair"], cwd=directory, env={"COSIGN_PASSWORD": ""},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    return directory / "cosign.key", directory / "cosign.pub"


def test_release_script_publishes_what_the_default_chart_installs(
    crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    launcher = cluster.launcher
    if launcher is None:
        pytest.skip("needs the embedded cluster's registry")
    helm = Helm(cluster)
    version = project_version()
    cosign = cosign_binary()
    key, public = key_pair(cosign, tmp_path / "key")
    _, other = key_pair(cosign, tmp_path / "other-key")
    from images.builder.images import SPECS, build

    # Built here first: a build downloads from Debian's mirror and PyPI, which the namespace the
    # script runs in (to reach the registry) cannot; the script's own build step then reuses them.
    for name in SPECS:
        build(name, log=lambda line: None)
    # The workflow's step, run inside the cluster's namespace (where the registry is), with the
    # test registry's account and CA in place of `crane auth login ghcr.io`.
    signing = {"COSIGN": str(cosign), "COSIGN_KEY": str(key), "COSIGN_PASSWORD": ""}
    env = {**launcher.registry_env, **signing, "HELM": helm.argv[0], "PY": sys.executable}
    run = inside(launcher.netns, env, str(REPO / "scripts" / "release.sh"), registry.PREFIX, version)
    assert run.returncode == 0, run.stderr[-3000:]
    crane = launcher.registry_crane()
    archives = [build(name, log=lambda line: None) for name in SPECS]
    digests = {name: manifest_digest(archive) for name, archive in zip(SPECS, archives, strict=True)}
    *images, chart = run.stdout.split()
    assert images == [f"{registry.PREFIX}/{name}@{digest}" for name, digest in digests.items()], run.stdout
    assert chart.startswith(f"{registry.PREFIX}/charts/llm-operator@sha256:"), run.stdout
    assert crane.check("digest", f"{chart.partition('@')[0]}:{version}") == chart.partition("@")[2]
    for name, digest in digests.items():  # the launcher under its content tag, which pods name
        assert crane.check("digest", f"{registry.PREFIX}/{name}:{published_tag(name, version)}") == digest, (
            name
        )

    # What a user verifies (docs/helm.md), each by digest: the signature, then the attestations.
    def cosign_verify(*args: str, public: Path = public) -> subprocess.CompletedProcess[str]:
        return inside(launcher.netns, launcher.registry_env, str(cosign), *args, "--key", str(public),
                      "--insecure-ignore-tlog")  # fmt: skip

    def checks(ref: str) -> dict[str, subprocess.CompletedProcess[str]]:
        found = {
            "signature": cosign_verify("verify", ref),
            "provenance": cosign_verify("verify-attestation", "--type", "slsaprovenance1", ref),
            "other key": cosign_verify("verify", ref, public=other),
        }
        if ref != chart:
            found["sbom"] = cosign_verify("verify-attestation", "--type", "cyclonedx", ref)
        return found

    with ThreadPoolExecutor(4) as pool:  # each check waits on the registry more than on a core
        results = dict(zip([*images, chart], pool.map(checks, [*images, chart]), strict=True))
    for ref, found in results.items():
        refused = found.pop("other key")  # another key's signature is none
        assert refused.returncode != 0 and "no matching" in refused.stderr + refused.stdout, (ref, refused)
        for check, proc in found.items():
            assert proc.returncode == 0, (ref, check, proc.stderr)
    sboms = {
        name: json.loads(base64.b64decode(json.loads(results[ref]["sbom"].stdout.splitlines()[0])["payload"]))
        for name, ref in zip(SPECS, images, strict=True)
    }
    # The SBOM names what the operator image ships (its Python, our package).
    purls = {c.get("purl", "") for c in sboms["operator"]["predicate"]["components"]}
    assert any(p.startswith("pkg:deb/debian/python3@") for p in purls), sorted(purls)[:20]
    assert any(p.startswith(f"pkg:pypi/llm-operator@{version}") for p in purls), sorted(purls)[:20]
    # The launcher, without a package manager, names busybox and the libraries it ships.
    purls = {c.get("purl", "") for c in sboms["launcher"]["predicate"]["components"]}
    assert any(p.startswith("pkg:deb/debian/busybox-static@") for p in purls), sorted(purls)
    assert any(p.startswith("pkg:pypi/h11@") for p in purls), sorted(purls)
    # The version tag moves with every rebuild in the test world (never in a real release): what
    # `make images` does here drops the node's copies of an older build.
    pushed = launcher.push_images(archives)
    assert all(f":{version}" not in ref for ref in pushed), "the script pushed the version tags"

    # What a user does (docs/helm.md): pull the published chart by the digest just verified and
    # install it with default values.
    pulled = inside(launcher.netns, launcher.registry_env, helm.argv[0], "pull", f"oci://{chart}",
                    "-d", str(tmp_path))  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    (package,) = tmp_path.glob("llm-operator*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("llm-operator/Chart.yaml")
        assert member is not None
        assert yaml.safe_load(member)["appVersion"] == version
    name = f"llmop-{secrets.token_hex(3)}"
    try:
        helm("install", name, str(package), "--namespace", namespace, "--wait", f"--timeout={TIMEOUT}s")
        pods = kubectl.items("pods", namespace, f"app.kubernetes.io/instance={name}")
        assert pods and all(pod_ready(p) for p in pods)
        # The chart's default images are the released digests, pulled through the mirror.
        default = {
            n: f"{registry.DEFAULT_PREFIX}/{n}@{digests[n]}" for n in ("operator", "cpu-runtime", "fetch")
        }
        for pod in pods:
            (container,) = pod["spec"]["containers"]
            assert container["image"] == default["operator"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert (env["LLMOP_CPU_RUNTIME_IMAGE"], env["LLMOP_FETCH_IMAGE"]) == (
                default["cpu-runtime"],
                default["fetch"],
            )
            (status,) = pod["status"]["containerStatuses"]
            assert status["imageID"].endswith(digests["operator"])
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
    pods name `ghcr.io/llm-operator/llm-operator/cpu-runtime:<version>` and `.../launcher:<content
    tag>`, which the node pulls through its mirror of ghcr.io (before the registry, they stayed in
    ImagePullBackOff)."""
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's registry")
    op = OperatorProcess(cluster, tmp_path / "operator.log", ("--namespace", namespace))
    op.stop()
    for var in ("LLMOP_CPU_RUNTIME_IMAGE", "LLMOP_LAUNCHER_IMAGE_REPOSITORY"):
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
            == f"ghcr.io/llm-operator/llm-operator/launcher:{published_tag('launcher', version)}"
        )
        assert (
            pod["spec"]["containers"][0]["image"]
            == f"ghcr.io/llm-operator/llm-operator/cpu-runtime:{version}"
        )
        kubectl("delete", "llmdeployment", "tiny-llama", "--wait=true", namespace=namespace)
    finally:
        op.stop()
