"""The launcher image's tag is the content hash of the files it copies (llm_operator/inject.py):
stable wherever the package lies, changed by any change to those files and by nothing else, so
two operator versions with the same injected files render the same pod templates (no roll)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llm_operator import images, inject
from llm_operator.render.inject import inject_init_container

REPO = Path(__file__).resolve().parents[2]


def package_copy(root: Path) -> Path:
    """The operator as another checkout (or another release's install) would have it."""
    shutil.copytree(REPO / "operator" / "llm_operator", root / "operator" / "llm_operator", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(REPO / "model_repo_templates", root / "model_repo_templates")
    return root / "operator" / "llm_operator"


def test_the_tag_is_stable_and_independent_of_where_the_files_lie(tmp_path: Path) -> None:
    tag = inject.content_tag()
    assert tag == inject.content_tag() and len(tag) == inject.TAG_HEX and int(tag, 16) >= 0
    inject.copy(tmp_path)  # only the injected files, as the launcher image holds them
    assert inject.content_tag(tmp_path / "llm_operator") == tag
    assert f"ghcr.io/llm-operator/llm-operator/launcher:{tag}" == images.DEFAULT_LAUNCHER_IMAGE


def test_any_change_to_an_injected_file_changes_the_tag_and_nothing_else_does(tmp_path: Path) -> None:
    package = package_copy(tmp_path)
    tag = inject.content_tag(package)
    assert tag == inject.content_tag()
    # Not injected: the controller, the API, the copier module itself.
    for rel in ("controller/config.py", "api/v1alpha1.py", "inject.py"):
        (package / rel).write_text((package / rel).read_text() + "\n# another release\n")
    (package / "controller" / "new_module.py").write_text("X = 1\n")
    assert inject.content_tag(package) == tag
    launcher = package / "runtime" / "launcher.py"
    original = launcher.read_bytes()
    launcher.write_bytes(original + b"\n")
    changed = inject.content_tag(package)
    assert changed != tag
    launcher.write_bytes(original)
    assert inject.content_tag(package) == tag
    (package / "runtime" / "added.py").write_text("")  # a new file the launcher would import
    assert inject.content_tag(package) not in (tag, changed)


def test_bytes_moved_between_files_change_the_tag(tmp_path: Path) -> None:
    package = package_copy(tmp_path)
    tag = inject.content_tag(package)
    first, second = (package / rel for rel in inject.files(package)[2:4])  # consecutive in the hash
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(a + b[:10])
    second.write_bytes(b[10:])
    assert inject.content_tag(package) != tag


def test_a_repository_with_a_tag_or_digest_is_refused() -> None:
    assert images.launcher_image("registry.example.com:5000/launcher").startswith(
        "registry.example.com:5000/launcher:"
    )
    for bad in ("", "registry.example.com/launcher:1", "registry.example.com/launcher@sha256:00"):
        with pytest.raises(ValueError, match="LLMOP_LAUNCHER_IMAGE_REPOSITORY"):
            images.launcher_image(bad)


def render(root: Path, example: str) -> str:
    """`llm-operator render` of `example` by the operator package under root, as the chart runs it
    (no LLMOP_* settings: its defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMOP_")}
    env["PYTHONPATH"] = str(root / "operator")
    done = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(REPO / "examples" / example)],
        capture_output=True, text=True, timeout=120, env=env, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("example", ["llama3-8b-h100.yaml", "cpu-reference.yaml"])
def test_two_operator_versions_with_the_same_injected_files_render_the_same_pods(
    tmp_path: Path, example: str
) -> None:
    old, new = package_copy(tmp_path / "old"), package_copy(tmp_path / "new")
    # A release that changes the controller and the operator's own defaults, not the launcher.
    (new / "controller" / "config.py").write_text((new / "controller/config.py").read_text() + "\n# 0.2.0\n")
    images_py = (new / "images.py").read_text()
    (new / "images.py").write_text(images_py.replace("operator/operator:0.1.0", "operator/operator:0.2.0"))
    before = render(tmp_path / "old", example)
    assert "initContainers" in before and f"launcher:{inject.content_tag(old)}" in before
    assert render(tmp_path / "new", example) == before
    # One that changes an injected file names another launcher image, hence another pod template.
    frontdoor = new / "frontdoor" / "__main__.py"
    frontdoor.write_text(frontdoor.read_text() + "\n# a fix\n")
    after = render(tmp_path / "new", example)
    assert after != before and f"launcher:{inject.content_tag(new)}" in after
    assert inject_init_container(f"x:{inject.content_tag(new)}")["image"] != f"x:{inject.content_tag(old)}"
