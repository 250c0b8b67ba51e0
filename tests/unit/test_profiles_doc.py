"""docs/runtime.md's profile table is what profiles.py holds: the defaults a user reads are the
ones rendered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llm_operator.api.v1alpha1 import Profile
from llm_operator.profiles import PROFILES, ProfileDefaults

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def _on(value: bool) -> str:
    return "on" if value else "off"


ROWS: dict[str, Callable[[ProfileDefaults], str]] = {
    "batching strategy": lambda p: str(p.batching_strategy),
    "max queue delay": lambda p: f"{p.max_queue_delay_microseconds} us",
    "max queue size (tensorrt_llm only)": lambda p: str(p.max_queue_size or "unbounded"),
    "scheduler policy": lambda p: str(p.scheduler_policy),
    "KV cache fraction": lambda p: f"{p.kv_cache_free_gpu_memory_percent} %",
    "block reuse": lambda p: _on(p.kv_cache_reuse),
    "chunked context": lambda p: _on(p.chunked_context),
    "tokenizer instances": lambda p: str(p.preprocessing_instances),
    "detokenizer instances": lambda p: str(p.postprocessing_instances),
    "cpu-reference model instances": lambda p: str(p.cpu_model_instances),
    "cancellation check period": lambda p: f"{p.cancellation_check_period_ms} ms",
    "stats check period": lambda p: f"{p.stats_check_period_ms} ms",
}
COLUMNS = (Profile.LATENCY, Profile.BALANCED, Profile.THROUGHPUT)


def documented() -> dict[str, list[str]]:
    text = DOC.read_text()
    table = text[text.index("| | latency | balanced (default) | throughput |") :].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: row[1:] for row in rows}


def test_the_documented_profiles_are_the_rendered_defaults() -> None:
    expected = {name: [show(PROFILES[p]) for p in COLUMNS] for name, show in ROWS.items()}
    assert documented() == expected


def test_every_profile_default_has_a_row() -> None:
    fields = set(ProfileDefaults.__dataclass_fields__)
    shown = {f for show in ROWS.values() for f in fields if f in show.__code__.co_names}
    assert shown == fields
