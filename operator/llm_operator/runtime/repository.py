"""The Triton model repository on disk, and how it travels in a ConfigMap: the operator encodes it
(modelrepo), the launcher materializes it in the pod. Stdlib only, like the rest of the runtime.

ConfigMap keys allow only [-._a-zA-Z0-9], so a path travels with `/` written as `__`
(`tensorrt_llm/config.pbtxt` -> `tensorrt_llm__config.pbtxt`). That is unambiguous because no path
component may contain `__` or start or end with `_`; configmap_key refuses paths that would.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

SEPARATOR = "__"
# What turns the C++ backend's guided decoder on (model_repo_templates/inflight_batcher_llm/
# tensorrt_llm.pbtxt.j2): emptied, the model loads without one.
GUIDED_DECODING = re.compile(
    r'(key: "(?:guided_decoding_backend|xgrammar_tokenizer_info_path)" value: \{ string_value: )"[^"]*"'
)
_COMPONENT = re.compile(r"[-.a-zA-Z0-9]+(_[-.a-zA-Z0-9]+)*")


def _components(path: str, parts: list[str]) -> list[str]:
    if len(parts) < 2 or not all(_COMPONENT.fullmatch(p) for p in parts):
        raise ValueError(
            f"{path!r} is not a model repository file that a ConfigMap can carry: it needs a model "
            f"directory, and each path component [-._a-zA-Z0-9] only, no '{SEPARATOR}', no leading or "
            "trailing '_'"
        )
    return parts


def configmap_key(path: str) -> str:
    return SEPARATOR.join(_components(path, path.split("/")))


def configmap_path(key: str) -> str:
    return "/".join(_components(key, key.split(SEPARATOR)))


def write_repository(files: Mapping[str, str], out_dir: str | Path) -> None:
    """Write rendered files as a Triton repository, with the version directory `1/` of every model
    (Triton skips a model without one; TensorRT-LLM's and the ensemble's stay empty)."""
    root = Path(out_dir)
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        (root / path.split("/", 1)[0] / "1").mkdir(exist_ok=True)


def materialize(
    configmap_dir: str | Path, dest_dir: str | Path, image_files: Mapping[str, Path] | None = None
) -> None:
    """Inside the pod: the mounted ConfigMap -> the repository tritonserver loads.

    `dest_dir` is emptied first (a restarted container must not load stale models). `image_files`
    (repository path -> file) adds code that ships in the serving image rather than in the
    ConfigMap: the TensorRT-LLM pre/postprocessing models, the llmapi model's model.py and helpers.
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    files = {
        configmap_path(entry.name): entry.read_text()
        for entry in sorted(Path(configmap_dir).iterdir())
        if not entry.name.startswith(".")  # kubelet's own entries: ..data, ..2025_11_22_...
    }
    write_repository(files, dest)
    for path, source in (image_files or {}).items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest / path)


def without_guided_decoding(repository: str | Path) -> None:
    """The engine contract's `tensorrt_llm` without its guided decoder: the backend refuses to load
    one whose tokenizer info file is missing (NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/
    src/model_instance_state.cc, getGuidedDecodingConfigFromParams: "Xgrammar's tokenizer info path
    at %s does not exist"), and loads without one when either parameter is empty."""
    config = Path(repository) / "tensorrt_llm" / "config.pbtxt"
    config.write_text(GUIDED_DECODING.sub(r'\1""', config.read_text()))
