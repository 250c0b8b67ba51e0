"""The CLI as users install it: our wheel in a fresh virtual environment, run from a directory
outside the checkout, renders every example (byte for byte the golden files) and writes a model
repository. Templates missing from the wheel failed exactly here (TemplateNotFound). The checkout's
own CLI is the reference, not the goldens: these pin the launcher image's tag (tests/golden_files.py),
which the revision hash covers, and the installed CLI renders the real one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
GOLDEN = REPO / "tests/golden/render"

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding our wheel; its third-party dependencies are this environment's
    (appended to sys.path after the wheel's site-packages: no network needed)."""
    root = tmp_path_factory.mktemp("installed")
    src = root / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "operator", src / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(root / "dist"), str(src)]
    subprocess.run([*pip, *build], check=True, capture_output=True)
    (wheel,) = (root / "dist").glob("llm_operator-*.whl")
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    python = env / "bin/python"
    # Without PYTHONPATH: a checkout on it (with its editable install's egg-info) would make pip
    # find llm_operator already installed and skip the wheel.
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel],
                   check=True, capture_output=True, env=clean_env())  # fmt: skip
    site = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    )
    Path(site.decode().strip(), "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env


def clean_env() -> dict[str, str]:
    """The environment less what would point Python, or the version the goldens assume, elsewhere."""
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "LLMOP_TRTLLM_VERSION")
    }


def installed(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=clean_env(), timeout=120, check=False
    )


def test_the_package_comes_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    probe = "import llm_operator; print(llm_operator.__file__)"
    done = installed(str(venv / "bin/python"), "-c", probe, cwd=tmp_path)
    assert Path(done.stdout.strip()).is_relative_to(venv), done.stdout + done.stderr


def test_installed_cli_renders_every_example(venv: Path, tmp_path: Path) -> None:
    for example in EXAMPLES:
        shutil.copy2(example, tmp_path / example.name)
        done = installed(str(venv / "bin/llm-operator"), "render", "-f", example.name, cwd=tmp_path)
        assert done.returncode == 0, f"{example.name}: {done.stderr}"
        checkout = subprocess.run(
            [sys.executable, "-m", "llm_operator.cli", "render", "-f", example.name],
            capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
            env={**clean_env(), "PYTHONPATH": str(REPO / "operator")},
        )  # fmt: skip
        assert (GOLDEN / example.name).exists() == bool(checkout.stdout), example.name
        assert done.stdout == checkout.stdout, example.name


def test_installed_cli_writes_a_model_repository(venv: Path, tmp_path: Path) -> None:
    shutil.copy2(REPO / "examples/cpu-reference.yaml", tmp_path / "app.yaml")
    done = installed(str(venv / "bin/llm-operator"), "model-repo", "-f", "app.yaml", "-o", "repo",
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tiny-llama" in (tmp_path / "repo/tensorrt_llm/config.pbtxt").read_text()  # the llmapi contract
    assert (tmp_path / "repo/tensorrt_llm/1/model.py").stat().st_size > 0


def test_installed_cli_refuses_bad_input_in_one_line(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- kind: LLMDeployment\n")
    for name, line in (
        ("missing.yaml", "missing.yaml: file: does not exist\n"),
        ("list.yaml", "list.yaml: document 1: is a list, not a Kubernetes object (a mapping with kind)\n"),
    ):
        done = installed(str(venv / "bin/llm-operator"), "render", "-f", name, cwd=tmp_path)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", line)
