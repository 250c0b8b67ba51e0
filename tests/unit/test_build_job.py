"""Build Jobs on NVIDIA's image: the steps and their images, the sizing rule, the fetch step
(engine/fetch.py) and that what runs in the Job's images needs only the standard library."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import inject, releases
from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec, Precision
from llm_operator.desired import builder_image
from llm_operator.engine import build as b
from llm_operator.engine import build_job
from llm_operator.engine import fetch as f
from llm_operator.engine.sizing import build_size
from llm_operator.images import Images
from llm_operator.plan.memory import GIB
from llm_operator.plan.types import PlanningError, PoolPlan
from llm_operator.storage import cached_model

from tests.unit.model_cache_fixtures import CACHED

REPO = Path(__file__).resolve().parents[2]
IMAGES = Images("runtime", "cpu-runtime", "", releases.DEFAULT.trtllm, launcher="launcher:1", fetch="fetch:1")
OWNER = {"apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment", "name": "x", "uid": "u"}
H100x8 = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",), (9, 0), 81559, 8, 2, 8, 2, 1)


def body(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    return doc


def example(name: str, edit: Any = None) -> LLMDeployment:
    """The example, changed by `edit(spec dict)` first (the models are frozen)."""
    doc = body(name)
    if edit is not None:
        edit(doc["spec"])
    return LLMDeployment.model_validate(doc)


def job(spec: LLMDeploymentSpec, pool: PoolPlan = H100x8) -> dict[str, Any]:
    """The build of a model the cache holds (the examples' sources are s3://)."""
    model = cached_model(spec.model.cache.claim_name, CACHED.directory) if spec.model.cache else None
    return build_job("x", "ns", spec, pool, "k", image="nvidia:1", images=IMAGES, owner=OWNER, model=model)


def with_cache(name: str, uri: str) -> LLMDeploymentSpec:
    # Admission allows pvc:// caches only today; build_job supports object stores already.
    return example(name, lambda s: s["engine"].update(cache={"uri": uri})).spec


def steps(j: dict[str, Any]) -> list[tuple[str, str]]:
    pod = j["spec"]["template"]["spec"]
    return [(c["name"], c["image"]) for c in pod["initContainers"] + pod["containers"]]


def test_the_build_runs_in_nvidias_image_between_our_fetch_steps() -> None:
    spec = example("llama31-405b-multinode").spec
    assert steps(job(spec)) == [
        ("llm-operator-lib", "launcher:1"),
        ("fetch", "fetch:1"),
        ("build", "nvidia:1"),
    ]
    s3 = job(with_cache("llama31-405b-multinode", "s3://engines/llm"))
    assert steps(s3)[-2:] == [("build", "nvidia:1"), ("publish", "fetch:1")]
    pod = s3["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["publish"], "the last step is the main container"
    build = pod["initContainers"][-1]
    assert build["command"] == ["python3", "-m", "llm_operator.engine.build"], "the image's own python3"
    assert {"name": "PYTHONPATH", "value": "/var/run/llm-operator/lib"} in build["env"]
    # No step of ours may fail silently: exit 78 of any of them fails the Job without retries.
    rules = s3["spec"]["podFailurePolicy"]["rules"]
    assert [r["onExitCodes"]["containerName"] for r in rules] == ["fetch", "build", "publish"]


def test_every_container_runs_restricted() -> None:
    j = job(with_cache("llama31-405b-multinode", "gs://engines/llm"))
    pod = j["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for c in pod["initContainers"] + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]


def test_the_builder_image_is_nvidias_of_the_release_unless_overridden() -> None:
    ld = example("llama3-70b-fp8")
    assert builder_image(ld, IMAGES, "1.1.0") == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert builder_image(ld, IMAGES, "1.0.0") == "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
    mirror = dataclasses.replace(IMAGES, engine_builder="mirror.example/tritonserver:25.12")
    assert builder_image(ld, mirror, "1.1.0") == "mirror.example/tritonserver:25.12"
    own = example("llama3-70b-fp8", lambda s: s["engine"]["build"].update(image="registry.example/mine:1"))
    assert builder_image(own, mirror, "1.1.0") == "registry.example/mine:1"
    with pytest.raises(PlanningError, match=r"set engine\.build\.image") as refused:
        builder_image(ld, IMAGES, "0.19.0")
    assert refused.value.reason == "BuilderImageUnknown"


# --- sizing -----------------------------------------------------------------------------------


def test_the_405b_example_is_sized_to_fit_its_nodes_and_cache() -> None:
    """Llama 3.1 405B (405.9e9 parameters) in FP8 at tp 8 x pp 2, built on one 8-GPU pod."""
    spec = example("llama31-405b-multinode").spec
    size = build_size(spec, H100x8, 8)
    assert size is not None
    checkpoint = 405.9e9 * 2
    assert size.memory == pytest.approx(checkpoint * 1.1 + 8 * 4 * GIB, abs=1)
    assert size.memory_quantity == "864Gi"  # p5.48xlarge: 2048Gi
    # converted checkpoint + engine (the checkpoint is read from the model cache), FP8 weights with
    # 16-bit embeddings per rank (the first stage's ranks with the 16-bit embedding: <= ~480 GB)
    assert 2 * 405.9e9 * 1.1 < size.scratch < 2 * 480e9 * 1.1
    assert size.scratch_quantity == "961Gi"
    pvc = yaml.safe_load_all((REPO / "examples" / "engine-cache.yaml").read_text())
    claim = next(d for d in pvc if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Ti"  # >= 961Gi
    (build,) = job(spec)["spec"]["template"]["spec"]["containers"]  # pvc:// cache: no publish step
    assert build["name"] == "build" and build["resources"]["requests"]["memory"] == "864Gi"
    assert "memory" not in build["resources"]["limits"], "a peak above the estimate is not killed"


def test_scratch_never_counts_the_checkpoint_and_grows_with_the_precision() -> None:
    """The checkpoint is read where it is (the model cache, or a pvc:// source): the scratch is the
    converted checkpoint and the engine, whichever the source."""
    spec = example("llama3-70b-fp8").spec
    pool = dataclasses.replace(H100x8, tensor=4, pipeline=1, gpus_per_pod=4, pods_per_replica=1)
    fetched = build_size(spec, pool, 4)

    def in_place(s: dict[str, Any]) -> None:
        s["model"]["source"].update(uri="pvc://models/llama3-70b")
        del s["model"]["cache"]

    read_in_place = build_size(example("llama3-70b-fp8", in_place).spec, pool, 4)
    assert fetched is not None and fetched == read_in_place
    fp16 = example("llama3-70b-fp8", lambda s: s["engine"].update(precision=Precision.FP16.value))
    wider = build_size(fp16.spec, pool, 4)
    assert wider is not None and wider.scratch > fetched.scratch and wider.memory == fetched.memory


def test_an_object_store_build_asks_the_node_for_its_scratch() -> None:
    j = job(with_cache("llama31-405b-multinode", "s3://engines/llm"))
    pod = j["spec"]["template"]["spec"]
    build = pod["initContainers"][-1]
    assert build["resources"]["requests"]["ephemeral-storage"] == "961Gi"
    assert {"name": "work", "emptyDir": {"sizeLimit": "961Gi"}} in pod["volumes"]


def test_an_unknown_architecture_requests_nothing_it_cannot_compute() -> None:
    def unknown(s: dict[str, Any]) -> None:
        s["model"].update(
            name="acme/unheard-of-7b", source={"uri": "s3://models/unheard-of/"}, family="llama"
        )

    spec = example("llama3-70b-fp8", unknown).spec
    assert build_size(spec, H100x8, 8) is None
    build = job(spec)["spec"]["template"]["spec"]["containers"][-1]
    assert set(build["resources"]["requests"]) == {"nvidia.com/gpu"}


# --- the fetch step ---------------------------------------------------------------------------


def test_engine_upload_per_store() -> None:
    files, marker = f.upload_commands("/work/engine", "s3://e/k")
    assert files[-2:] == ["/work/engine", "s3://e/k"] and f.MARKER in files
    assert marker == ["aws", "s3", "cp", f"/work/engine/{f.MARKER}", f"s3://e/k/{f.MARKER}"]
    assert f.MARKER == b.MARKER and f.CACHED == b.CACHED, "build.py and fetch.py read each other's files"


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!{sys.executable}\nimport sys, pathlib\nargv = sys.argv[1:]\n{body}")
    tool.chmod(0o755)


def injected(tmp_path: Path) -> Path:
    """What the inject init container puts on PYTHONPATH for the fetch and build steps."""
    lib = tmp_path / "lib"
    inject.copy(lib)
    return lib


def run_stdlib_only(lib: Path, module: str, argv: list[str], path: str) -> subprocess.CompletedProcess[str]:
    """python -S -I: no site-packages, no PYTHONPATH; only the injected copy is importable."""
    code = f"import runpy, sys; sys.path.insert(0, {str(lib)!r}); sys.argv[1:] = {argv!r}; "
    code += f"runpy.run_module({module!r}, run_name='__main__')"
    env = {"PATH": path, "HOME": str(lib)}
    return subprocess.run([sys.executable, "-S", "-I", "-c", code], env=env, capture_output=True, text=True)


def test_fetch_copies_the_examples_then_build_and_publish_skip_a_hit(tmp_path: Path) -> None:
    """The fetch and publish steps as the Job runs them, standard library only, with a stand-in
    aws that records uploads. The checkpoint is not downloaded: the build reads the model cache."""
    lib, bin_dir, store = injected(tmp_path), tmp_path / "bin", tmp_path / "store"
    bin_dir.mkdir()
    store.mkdir()
    stand_in(bin_dir, "aws", f"store = pathlib.Path({str(store)!r})\n"
             "if argv[:2] == ['s3', 'cp'] and argv[-1] == '-':\n"
             "    marker = store / 'marker'\n"
             "    sys.exit(1) if not marker.exists() else print(marker.read_text())\n"
             "else:\n"
             "    (store / 'calls').open('a').write(' '.join(argv) + '\\n')\n"
             "    if argv[1] == 'cp': (store / 'marker').write_text('k')\n")  # fmt: skip
    examples = tmp_path / "examples" / "v1.1.0" / "quantization"
    examples.mkdir(parents=True)
    (examples / "quantize.py").write_text("")
    work, path = tmp_path / "work", f"{bin_dir}:/usr/bin:/bin"
    fetch = ["fetch", "--key", "k", "--work-dir", str(work), "--upload", "s3://e/k", "--examples-version",
             "1.1.0"]  # fmt: skip
    f_copy = lib / "llm_operator" / "engine" / "fetch.py"
    f_copy.write_text(f_copy.read_text().replace(f.FETCH_EXAMPLES_ROOT, str(tmp_path / "examples")))
    done = run_stdlib_only(lib, "llm_operator.engine.fetch", fetch, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (work / "model").exists(), "the checkpoint is the model cache's"
    assert (work / "trtllm-examples" / "quantization" / "quantize.py").is_file()
    assert not (work / f.CACHED).exists()

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / f.MARKER).write_text("k\n")
    publish = [
        "publish",
        "--key",
        "k",
        "--work-dir",
        str(work),
        "--engine",
        str(engine),
        "--upload",
        "s3://e/k",
    ]
    done = run_stdlib_only(lib, "llm_operator.engine.fetch", publish, path)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (store / "calls").read_text().splitlines()
    assert calls[0].startswith("s3 sync") and f"--exclude {f.MARKER}" in calls[0]
    assert calls[1].startswith("s3 cp") and calls[1].endswith(f"s3://e/k/{f.MARKER}"), "the marker last"

    # The next Job of this key: a hit. Nothing is downloaded, built or uploaded again.
    shutil.rmtree(work)
    done = run_stdlib_only(lib, "llm_operator.engine.fetch", fetch, path)
    assert done.returncode == 0 and "already in the cache" in done.stdout, done.stderr
    assert (work / f.CACHED).is_file() and not (work / "model").exists()
    build = ["--key", "k", "--model", "/var/lib/llm-operator/model-cache/models/s3-0/etags-0",
             "--precision", "fp16",
             "--kv-cache-dtype", "auto", "--sm", "sm90", "--output", str(engine), "--work-dir", str(work),
             "--tp", "1", "--pp", "1", "--gpus", "1", "--gpus-per-node", "1", "--max-batch-size", "1",
             "--max-input-len", "8", "--max-seq-len", "16", "--max-num-tokens", "16", "--max-beam-width", "1",
             "--family", "llama", "--upload", "s3://e/k", "--trtllm-version", "1.1.0"]  # fmt: skip
    done = run_stdlib_only(lib, "llm_operator.engine.build", build, path)
    assert done.returncode == 0 and "nothing to build" in done.stdout, done.stderr
    done = run_stdlib_only(lib, "llm_operator.engine.fetch", publish, path)
    assert done.returncode == 0 and "nothing to upload" in done.stdout, done.stderr
    assert len((store / "calls").read_text().splitlines()) == 2


def test_a_store_the_fetch_image_cannot_use_fails_the_job_at_once(tmp_path: Path) -> None:
    argv = ["publish", "--key", "k", "--work-dir", str(tmp_path / "w"), "--engine", str(tmp_path / "e"),
            "--upload", "ftp://engines/k"]  # fmt: skip
    done = run_stdlib_only(injected(tmp_path), "llm_operator.engine.fetch", argv, os.environ["PATH"])
    assert done.returncode == f.EXIT_CONFIG and "uploaded to s3:// or gs:// caches only" in done.stderr
