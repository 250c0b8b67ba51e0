"""`llm-operator render` of every example is pinned by golden files (tests/golden/render/).

The render is what the operator applies (same builders), so any change to a child object shows up
here as a reviewable diff. Regenerate after an intended change: UPDATE_GOLDEN=1 make test-unit.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import yaml
from llm_operator.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if p.name != "engine-cache.yaml")
GOLDEN = REPO / "tests" / "golden" / "render"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_matches_golden(example: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["render", "-f", str(example)]) == 0
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out.getvalue())
    assert golden.exists(), f"no golden file for {example.name}: run with UPDATE_GOLDEN=1"
    assert out.getvalue() == golden.read_text(), (
        f"render of {example.name} changed: review, then UPDATE_GOLDEN=1"
    )


def test_render_reports_an_impossible_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "examples" / "llama3-8b-h100.yaml").read_text().replace("tensor: 1", "tensor: 64"))
    assert main(["render", "-f", str(bad)]) == 1
    assert "cannot be placed" in capsys.readouterr().err


def test_render_refuses_a_nodes_file_that_is_not_nodes(tmp_path: Path) -> None:
    pools = REPO / "e2e" / "cluster" / "gpu-node-pools.yaml"  # node pools, not Node objects
    with pytest.raises(SystemExit, match="not a list of Node objects"):
        main(["render", "-f", str(REPO / "examples" / "llama3-8b-h100.yaml"), "--nodes", str(pools)])


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
