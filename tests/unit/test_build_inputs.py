"""What engine/build.py finds in the build pod: TensorRT-LLM's examples (the fetch image's copy or
the image's own) and the checkpoint's activation dtype (its config.json), and what that does to
the engine cache key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.engine import build as b
from llm_operator.engine import cache_key
from llm_operator.plan.types import PoolPlan

H100 = PoolPlan("main", "NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"), (9, 0),
                81559, 4, 1, 4, 1, 1)  # fmt: skip
QUANTIZE = "quantization/quantize.py"


def argv(precision: str, model: Path, *extra: str) -> list[str]:
    return ["--key", "k", "--model", str(model), "--precision", precision, "--kv-cache-dtype", "auto",
            "--sm", "sm90", "--output", "/out/k", "--work-dir", "/w", "--tp", "8", "--pp", "2",
            "--gpus", "8", "--gpus-per-node", "8", "--max-batch-size", "8", "--max-input-len", "1024",
            "--max-seq-len", "2048", "--max-num-tokens", "2048", "--max-beam-width", "1",
            "--family", "llama", "--calib-dataset", "/calibration/text", *extra]  # fmt: skip


def checkpoint(tmp_path: Path, **config: object) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    return model


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- TensorRT-LLM's examples -------------------------------------------------------------------


def script_in(root: Path, relative: str = QUANTIZE) -> Path:
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).write_text("")
    return root / relative


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build image's own examples directory, empty; the fetch copy's path is set, not made."""
    assert b.examples().roots[-1] == Path("/app/examples"), "NVIDIA's image: WORKDIR /app, COPY examples"
    monkeypatch.setattr(b, "IMAGE_EXAMPLES", str(tmp_path / "app" / "examples"))
    monkeypatch.setenv("LLMOP_TRTLLM_EXAMPLES", str(tmp_path / "work" / "trtllm-examples"))
    return tmp_path / "app" / "examples"


def test_the_fetch_images_copy_comes_first(image: Path, tmp_path: Path) -> None:
    fetched = script_in(tmp_path / "work" / "trtllm-examples")
    script_in(image)
    assert b.examples().script([QUANTIZE]) == fetched


def test_without_a_fetched_copy_the_images_own_examples_are_used(image: Path) -> None:
    """A fetch image without examples (images.builder makes those) copies none."""
    quantize, llama = script_in(image), script_in(image, "models/core/llama/convert_checkpoint.py")
    assert b.examples().script([QUANTIZE]) == quantize
    assert b.examples().script(b.converter("mistral")) == llama


def test_a_script_in_neither_place_is_refused_naming_both(
    image: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = checkpoint(tmp_path, torch_dtype="bfloat16")
    args = argv("fp8", model)
    args[args.index("/out/k")] = str(tmp_path / "out")
    assert b.main(args) == b.EXIT_CONFIG  # retrying cannot bring the script
    said = capsys.readouterr().err
    assert f"examples/{QUANTIZE} is in none of {tmp_path}/work/trtllm-examples, {image}:" in said
    # A dry run names where the build would look first.
    assert b.main([*args, "--dry-run"]) == 0
    assert f"{tmp_path}/work/trtllm-examples/{QUANTIZE}" in capsys.readouterr().out


# --- the activation dtype ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "config", "dtype"),
    [
        ("fp8", {"torch_dtype": "bfloat16"}, "bfloat16"),  # Llama 3.x
        ("int4-awq", {"torch_dtype": "float16"}, "float16"),
        ("w4a8-awq", {"dtype": "bfloat16"}, "bfloat16"),  # transformers >= 4.56 writes `dtype`
        ("int8-sq", {"torch_dtype": "float32"}, "float16"),
        ("fp8", {}, "float16"),
        ("fp16", {"torch_dtype": "bfloat16"}, "float16"),  # an explicit 16-bit precision wins
        ("bf16", {"torch_dtype": "float16"}, "bfloat16"),
    ],
)  # fmt: skip
def test_quantized_builds_keep_the_checkpoints_dtype(
    tmp_path: Path, precision: str, config: dict[str, str], dtype: str
) -> None:
    found, why = b.activation_dtype(precision, checkpoint(tmp_path, **config))
    assert found == dtype
    if precision in ("fp16", "bf16"):
        assert why == f"precision {precision}"
    elif "float32" in config.values():
        assert why == "the checkpoint's torch_dtype is float32, not a 16-bit type: float16"
    elif not config:
        assert why.endswith("config.json declares no torch_dtype: the default float16")


def test_a_bf16_checkpoint_quantizes_and_converts_in_bfloat16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upstream's 405B recipe ("Run BF16 model by FP8") converts with --dtype bfloat16."""
    model = checkpoint(tmp_path, torch_dtype="bfloat16")
    for extra in ([], ["--fp8-rowwise"]):
        convert, _ = b.conversion(b.parse([*argv("fp8", model, *extra), "--dry-run"]), str(model), "/w")
        assert flag(convert, "--dtype") == "bfloat16"
    assert "activation dtype bfloat16: the checkpoint's torch_dtype bfloat16" in capsys.readouterr().out


def test_a_config_that_is_not_json_is_refused(tmp_path: Path) -> None:
    model = checkpoint(tmp_path)
    (model / "config.json").write_text("{not json")
    with pytest.raises(b.BuildError, match=r"config.json cannot be read as JSON .*a Hugging Face checkpoint"):
        b.activation_dtype("fp8", model)


def test_only_quantized_keys_change_with_the_checkpoint_dtype() -> None:
    """Keys before the dtype came from the checkpoint: 16-bit engines already cached stay valid,
    quantized ones (built in float16 whatever the checkpoint) are built again."""

    def key(precision: str, kv: str) -> str:
        spec = LLMDeploymentSpec.model_validate({
            "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}},
            "engine": {"backend": "tensorrt-engine", "precision": precision, "kvCacheDtype": kv,
                       "build": {"calibration": {"datasetUri": "pvc://calibration/cnn_dailymail"}}},
        })  # fmt: skip
        return cache_key(spec, H100, "1.1.0").rsplit("-", 1)[1]

    assert key("fp16", "auto") == "35c8d94a2b13"
    assert key("bf16", "auto") == "bda59d0eb695"
    assert key("fp16", "fp8") == "d8a795e90e83"
    assert key("fp8", "fp8") != "ebf66e12e915"
    assert key("int4-awq", "auto") != "7e335946f194"
