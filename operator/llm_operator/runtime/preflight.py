"""What the launcher checks before Triton starts: every file this pod's model repository loads
exists. Without it Triton (or a pre/postprocessing model) fails halfway through loading, with a
message that rarely names the file, and the pod crash-loops; here the first missing path is one
line, the container's termination message, and exit 78 (launcher.EXIT_CONFIG), which the operator
reports as Stalled (LauncherRefused). Stdlib only, like the rest of the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

from llm_operator.contract import ENV
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.repository import SEPARATOR

# TensorRT-LLM's python models whose model.py ships in the serving image, under
# LLMOP_TRTLLM_MODELS_DIR (NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
# <model>/1/model.py since 0.20, releases.py; tensorrtllm_backend all_models/... up to v0.19.0).
TRTLLM_PYTHON_MODELS = ("preprocessing", "postprocessing")
# The llmapi model's code in the serving image (NVIDIA/TensorRT-LLM triton_backend/all_models/
# llmapi/tensorrt_llm/1/, copied to /app/all_models/llmapi by NVIDIA's image), repository path ->
# its path there: NVIDIA's model.py is the base class of the operator's model.py (runtime/
# llmapi_model.py, which the ConfigMap carries), and imports helpers.py from its own directory.
LLMAPI_FILES = {
    "tensorrt_llm/1/base_model.py": "tensorrt_llm/1/model.py",
    "tensorrt_llm/1/helpers.py": "tensorrt_llm/1/helpers.py",
}
# What transformers' AutoTokenizer.from_pretrained loads a tokenizer from, one of: a fast tokenizer
# (tokenizer.json), a SentencePiece or tiktoken model (tokenizer.model), byte-level BPE
# (vocab.json with merges.txt) or WordPiece (vocab.txt) vocabularies. Pre/postprocessing load
# tokenizer_dir with AutoTokenizer.from_pretrained(tokenizer_dir, legacy=False,
# padding_side='left', trust_remote_code=True) (NVIDIA/TensorRT-LLM
# triton_backend/all_models/inflight_batcher_llm/preprocessing/1/model.py, initialize()).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
# What the cpu-reference model loads from a cached model's directory (runtime/cpu_reference/
# checkpoint.py, which needs torch and is not in the launcher's copy: it checks their content).
CPU_REFERENCE_CHECKPOINT_FILES = ("config.json", "model.safetensors")
CPU_REFERENCE_MODEL_TYPE = "llm-operator-tiny"  # checkpoint.MODEL_TYPE (test_preflight: they agree)
CPU_REFERENCE_PACKAGED_WEIGHTS = "model.gguf"  # gguf_files.WEIGHTS_FILE: a packaged model's layout


def image_files(c: PodConfig) -> dict[str, Path]:
    """Repository path -> file of the model code that ships in the serving image, not in the
    ConfigMap (the cpu-reference model's does): TensorRT-LLM's pre/postprocessing model.py for each
    of them the repository holds, or the llmapi model's model.py (as base_model.py) and helpers.py."""
    if c.backend == "cpu-reference":
        return {}
    if c.backend == "pytorch":
        base = Path(c.llmapi_models_dir)
        return {path: base / source for path, source in LLMAPI_FILES.items()}
    src = Path(c.model_repo_src)
    base = Path(c.trtllm_models_dir)
    return {
        f"{m}/1/model.py": base / m / "1" / "model.py"
        for m in TRTLLM_PYTHON_MODELS
        if (src / f"{m}{SEPARATOR}config.pbtxt").exists()
    }


def image_file_paths(backend: str) -> dict[str, str]:
    """Repository path -> where the serving image keeps it, by the contract's defaults: what
    `llm-operator model-repo` cannot write (the file is NVIDIA's, not ours)."""
    if backend == "pytorch":
        base = ENV["LLMOP_LLMAPI_MODELS_DIR"]
        return {path: f"{base}/{source}" for path, source in LLMAPI_FILES.items()}
    if backend == "tensorrt-engine":
        base = ENV["LLMOP_TRTLLM_MODELS_DIR"]
        return {f"{m}/1/model.py": f"{base}/{m}/1/model.py" for m in TRTLLM_PYTHON_MODELS}
    return {}


def _model_type(config: Path) -> object:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data.get("model_type") if isinstance(data, dict) else None


def first_missing(c: PodConfig) -> str | None:
    """One line naming the first file this pod needs that is not there, or None."""
    for repository_path, path in image_files(c).items():
        if not path.is_file():
            model = repository_path.split("/", 1)[0]
            return f"{path} not found: the serving image has no TensorRT-LLM {model} model there"
    if c.backend == "tensorrt-engine" and c.engine_dir:
        engine = Path(c.engine_dir)
        if not (engine / "config.json").is_file():
            return f"{engine}/config.json not found: is the engine cache mounted and the engine built?"
        for rank in range(c.world_size):
            if not (engine / f"rank{rank}.engine").is_file():
                return f"{engine}/rank{rank}.engine not found: tp*pp = {c.world_size} ranks, one engine each"
    if (
        c.backend == "cpu-reference"
        and c.model_dir
        and not (Path(c.model_dir) / CPU_REFERENCE_PACKAGED_WEIGHTS).is_file()
    ):
        cached = Path(c.model_dir)
        for name in CPU_REFERENCE_CHECKPOINT_FILES:
            if not (cached / name).is_file():
                return (
                    f"{cached}/{name} not found: the cpu-reference backend serves checkpoints of "
                    f"{' and '.join(CPU_REFERENCE_CHECKPOINT_FILES)} with the tokenizer files beside them "
                    f"(or a packaged model's {CPU_REFERENCE_PACKAGED_WEIGHTS} and tokenizer files)"
                )
        if _model_type(cached / "config.json") != CPU_REFERENCE_MODEL_TYPE:
            return (
                f'{cached}/config.json: model_type is not "{CPU_REFERENCE_MODEL_TYPE}": the cpu-reference '
                "backend serves only its own tiny checkpoints; serve this model with the tensorrt-engine "
                "or pytorch backend"
            )
    if c.tokenizer_dir:
        tokenizer = Path(c.tokenizer_dir)
        if not any((tokenizer / name).is_file() for name in TOKENIZER_FILES):
            return (
                f"{tokenizer}/{TOKENIZER_FILES[0]} not found (nor {', '.join(TOKENIZER_FILES[1:])}): "
                "put the model's tokenizer there or point runtime.tokenizerUri at one"
            )
    return None
