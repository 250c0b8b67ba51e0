"""The environments of the tools users bring (benchmark clients, LiteLLM), each its own venv from
PyPI (scripts/ensure-tool-venv.sh NAME: requirements/NAME.lock; their pins conflict with the
operator's), shared by the e2e tier (tests/e2e/clients.py) and `make bench` (bench/routing.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALL_S = 1800  # a cold environment (scripts/test.sh installs them beside the tiers)
# Each tool's environment, and the command that proves it runs (ensure-tool-venv.sh's CHECK).
ENVIRONMENTS: dict[str, tuple[str, ...]] = {
    "bench": ("aiperf", "--version"),
    "inference-perf": ("inference-perf", "--help"),
    "guidellm": ("guidellm", "--version"),
    "litellm": ("python", "-c", "import litellm"),
}


def environment(name: str) -> Path:
    """The bin directory of the tool's environment, created the first time (cached after)."""
    done = subprocess.run([str(REPO / "scripts" / "ensure-tool-venv.sh"), name, *ENVIRONMENTS[name]],
                          capture_output=True, text=True, timeout=INSTALL_S, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"scripts/ensure-tool-venv.sh {name} failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])
