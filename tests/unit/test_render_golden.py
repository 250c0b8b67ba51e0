"""`llm-operator render` of every example is pinned by golden files (tests/golden/render/).

The render is what the operator applies (same builders), so any change to a child object shows up
here as a reviewable diff. Regenerate after an intended change: UPDATE_GOLDEN=1 make test-unit.

Each example renders against the version table's default release; RELEASE_GOLDENS adds renders
against other releases (`<example>@<TensorRT-LLM version>.yaml`).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import inject, releases
from llm_operator.cli import main

from tests.golden_files import assert_golden, pinned_launcher_tag

REPO = Path(__file__).resolve().parents[2]
# Examples that are no LLMDeployment: the engine cache claim, the HTTPRoute a user writes for a pool.
NOT_RENDERED = ("engine-cache.yaml", "httproute-inference-pool.yaml")
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if p.name not in NOT_RENDERED)
GOLDEN = REPO / "tests" / "golden" / "render"
# (example, TensorRT-LLM version of the serving image) rendered besides the default release: an
# older release (0.21.0, NGC 25.08) for the engine backend, and one for the pytorch backend.
RELEASE_GOLDENS = [("llama3-70b-fp8", "0.21.0"), ("llama31-8b-pytorch", "1.0.0")]
# Examples also rendered as LeaderWorkerSets (`<example>@lws.yaml`, `render --leader-worker-set`).
LWS_GOLDENS = ["llama31-405b-pytorch-multinode"]


@pytest.fixture(autouse=True)
def default_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's images run the version table's default release, whatever the caller's
    environment says; the launcher image's tag is pinned (tests/golden_files.py)."""
    monkeypatch.delenv("LLMOP_TRTLLM_VERSION", raising=False)
    monkeypatch.delenv("LLMOP_LAUNCHER_IMAGE_REPOSITORY", raising=False)
    monkeypatch.setattr(inject, "content_tag", pinned_launcher_tag)


def _render(example: Path, *flags: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["render", "-f", str(example), *flags]) == 0
    return out.getvalue()


@pytest.mark.parametrize(
    ("example", "version"), RELEASE_GOLDENS, ids=[f"{e}@{v}" for e, v in RELEASE_GOLDENS]
)
def test_render_for_another_release_matches_golden(
    example: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert releases.for_trtllm(version) is not None and version != releases.DEFAULT.trtllm
    monkeypatch.setenv("LLMOP_TRTLLM_VERSION", version)
    rendered = _render(REPO / "examples" / f"{example}.yaml")
    assert_golden(GOLDEN / f"{example}@{version}.yaml", rendered, f"render of {example} for {version}")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_matches_golden(example: Path) -> None:
    rendered = _render(example)
    assert_golden(GOLDEN / f"{example.stem}.yaml", rendered, f"render of {example.name}")


@pytest.mark.parametrize("example", LWS_GOLDENS)
def test_render_as_leader_worker_sets_matches_golden(example: str) -> None:
    rendered = _render(REPO / "examples" / f"{example}.yaml", "--leader-worker-set")
    assert "kind: LeaderWorkerSet" in rendered and "kind: StatefulSet" not in rendered
    assert_golden(GOLDEN / f"{example}@lws.yaml", rendered, f"LeaderWorkerSet render of {example}")


def test_render_reports_an_impossible_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "examples" / "llama3-8b-h100.yaml").read_text().replace("tensor: 1", "tensor: 64"))
    assert main(["render", "-f", str(bad)]) == 1
    assert "cannot be placed" in capsys.readouterr().err


def test_render_refuses_a_nodes_file_that_is_not_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    pools = REPO / "e2e" / "cluster" / "gpu-node-pools.yaml"  # node pools, not Node objects
    assert main(["render", "-f", str(REPO / "examples" / "llama3-8b-h100.yaml"), "--nodes", str(pools)]) == 1
    assert (
        capsys.readouterr().err
        == f"{pools}: document 1, apiVersion: is missing: every Kubernetes object has one\n"
    )


def test_render_can_target_a_cluster_with_leader_worker_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "llama3-70b-fp8.yaml").read_text())
    doc["spec"]["parallelism"] = {"tensor": 8, "pipeline": 2}  # two 8-GPU nodes per replica
    manifest = tmp_path / "multi-node.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    example = str(manifest)
    assert main(["render", "-f", example]) == 0
    plain = {o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)}
    assert main(["render", "-f", example, "--leader-worker-set"]) == 0
    lws = {o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)}
    assert "LeaderWorkerSet" not in plain and "LeaderWorkerSet" in lws


def _pod_templates(obj: dict[str, object]) -> list[dict[str, object]]:
    """Every pod template in a rendered object (LeaderWorkerSets have two)."""
    found: list[dict[str, object]] = []
    if isinstance(obj, dict):
        if "containers" in obj:
            found.append(obj)
        for value in obj.values():
            found += _pod_templates(value) if isinstance(value, dict) else []
    return found


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_rendered_pod_meets_restricted_pod_security(example: Path) -> None:
    """The API server enforces it in e2e (test_cluster_knowledge, test_chart_install); this names the
    field when a builder forgets one."""
    golden = GOLDEN / f"{example.stem}.yaml"
    pods = [p for o in yaml.safe_load_all(golden.read_text()) if o for p in _pod_templates(o)]
    assert pods
    for pod in pods:
        assert pod["securityContext"] == pod["securityContext"] | {  # type: ignore[operator]
            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}
        }, pod["securityContext"]  # fmt: skip
        # The init container that copies the launcher in too (render/inject.py).
        containers: list[dict[str, Any]] = [*pod["containers"], *pod.get("initContainers", [])]  # type: ignore[misc]
        for c in containers:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
        assert all("hostPath" not in v for v in pod.get("volumes", [])), "no hostPath"  # type: ignore[attr-defined]
