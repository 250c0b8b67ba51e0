"""`python -m llm_operator.inject DEST`: what the init container of every serving pod runs, with
the operator image's python (render/inject.py). It copies the standard-library-only part of this
package into DEST, an emptyDir that the main container (NVIDIA's image, unchanged) puts on its
PYTHONPATH to run `python3 -m llm_operator.runtime.launcher` or `python3 -m llm_operator.engine.build`
with its own python3, and the OpenAI front door (frontdoor/) that the launcher starts beside Triton.

Standard library only, like everything it copies (tests/unit/test_inject.py imports the copy with
nothing else on sys.path), except the front door, which also uses jinja2 and tokenizers: the
serving images have both (NVIDIA's through transformers; the CPU runtime image pins them).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def files() -> list[Path]:
    """Paths relative to the package: its root `__init__.py`, the serving contract, the launcher
    (runtime/ without cpu_reference/, which needs torch and stays in the cpu-runtime image) and the
    build Job's entry points (engine/build.py in NVIDIA's image, engine/fetch.py in the fetch
    image), and the front door. engine/__init__.py is left out: it renders the build Job (pydantic), and
    without it engine/ is a namespace package, which is all `-m llm_operator.engine.build` needs."""
    runtime = sorted(p.relative_to(PACKAGE) for p in (PACKAGE / "runtime").glob("*.py"))
    engine = [Path("engine/build.py"), Path("engine/fetch.py")]
    frontdoor = sorted(p.relative_to(PACKAGE) for p in (PACKAGE / "frontdoor").glob("*.py"))
    return [Path("__init__.py"), Path("contract.py"), *runtime, *engine, *frontdoor]


def copy(dest: Path) -> list[Path]:
    """Copy files() to DEST/llm_operator/; returns what it wrote."""
    written = []
    for rel in files():
        target = dest / "llm_operator" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE / rel, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llm_operator.inject DEST", file=sys.stderr)
        return 2
    written = copy(Path(args[0]))
    print(f"llm_operator: {len(written)} files copied to {args[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
