"""What the init container copies into NVIDIA's images (llm_operator/inject.py) runs there on the
standard library alone: the copy is imported by a python that sees nothing else (no site-packages,
no PYTHONPATH, no checkout), as the image's python3 sees it through PYTHONPATH."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from llm_operator import inject
from llm_operator.contract import LAUNCHER
from llm_operator.render.inject import INJECT_PATH, inject_init_container
from llm_operator.runtime.launcher import EXIT_USAGE

# -I: no PYTHONPATH, user site or script directory; -S: no site-packages. What is left on sys.path
# is the standard library, and the copy we put first.
ISOLATED = [sys.executable, "-I", "-S"]


def isolated(copy: Path, code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.path.insert(0, {str(copy)!r})\n"
    return subprocess.run([*ISOLATED, "-c", prelude + code], capture_output=True, text=True, timeout=60)


def test_the_init_containers_command_is_the_launcher_images_copy() -> None:
    init = inject_init_container("launcher:1")
    assert init["image"] == "launcher:1"
    assert init["command"] == ["/busybox", "cp", "-R", "-f", f"{inject.LAUNCHER_SOURCE}/.", INJECT_PATH]
    assert init["command"] == inject.copy_command(INJECT_PATH)


def test_the_python_copy_copies_the_package(tmp_path: Path) -> None:
    """The stand-in for the launcher image's copy in tests (tests/images test that one)."""
    done = subprocess.run([sys.executable, "-m", "llm_operator.inject", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    copied = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert copied == sorted(rel for rel, _ in inject.sources())
    ours = sorted(p for p in copied if p.startswith("llm_operator/"))
    assert ours == sorted(f"llm_operator/{rel}" for rel in inject.files())
    assert "h11/__init__.py" in copied and "h11/LICENSE.txt" in copied, "the front door's HTTP parser"
    assert "llm_operator/runtime/launcher.py" in copied and "llm_operator/engine/build.py" in copied
    assert "llm_operator/engine/fetch.py" in copied, "the build Job's fetch and publish steps"
    assert "llm_operator/engine/tokenizer_info.py" in copied, "build.py's tokenizer info step"
    assert "llm_operator/frontdoor/__main__.py" in copied, "the launcher starts the front door"
    assert not [p for p in copied if "cpu_reference" in p], "the model needs torch: it stays in its image"
    assert "llm_operator/engine/__init__.py" not in copied, "it renders build Jobs with pydantic"


def test_the_copy_imports_with_the_standard_library_alone(tmp_path: Path) -> None:
    """All but the front door, which the serving images' jinja2 and tokenizers serve
    (tests/unit/test_frontdoor_process.py guards its imports), and the llmapi wrapper with its
    structured-outputs module (numpy), which Triton's stub imports from the model repository beside
    its base model. The libraries shipped
    with the copy (h11) import from it, on the standard library alone."""
    inject.copy(tmp_path)
    modules = sorted(
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__")
        for p in tmp_path.rglob("*.py")
        if "frontdoor" not in p.parts and p.name not in ("llmapi_model.py", "llmapi_structured.py")
    )
    code = (
        "import importlib, json\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "files = sorted({getattr(m, '__file__', None) or '' for m in sys.modules.values()})\n"
        "print(json.dumps({'files': files, 'top': sorted({m.split('.')[0] for m in sys.modules})}))"
    )
    done = isolated(tmp_path, code)
    assert done.returncode == 0, done.stderr  # a ModuleNotFoundError names the package it needs
    seen = json.loads(done.stdout)
    third_party = {m for m in seen["top"] if m not in sys.stdlib_module_names and not m.startswith("_")}
    assert third_party == {"llm_operator", *inject.LIBRARIES}, third_party
    ours = [f for f in seen["files"] if any(f"/{name}/" in f for name in ("llm_operator", *inject.LIBRARIES))]
    assert ours and all(f.startswith(str(tmp_path)) for f in ours), "every module came from the copy"
    assert any(f.endswith("/h11/__init__.py") for f in ours)


def test_the_front_door_imports_whole_from_the_copy(tmp_path: Path) -> None:
    """Every module of the front door, subpackages included, comes from the copy (the serving
    images' jinja2 and tokenizers from site-packages, here the test environment's)."""
    inject.copy(tmp_path)
    site = [p for p in sys.path if p.endswith("-packages")]
    code = (
        f"sys.path[1:1] = {site!r}\n"
        "import pkgutil, importlib, llm_operator.frontdoor as fd\n"
        "for m in pkgutil.walk_packages(fd.__path__, 'llm_operator.frontdoor.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(m.__file__ for n, m in sys.modules.items() if n.startswith('llm_operator.frontdoor')))"
    )
    done = isolated(tmp_path, code)
    assert done.returncode == 0, done.stderr
    files = done.stdout
    assert str(tmp_path / "llm_operator/frontdoor/tools/parsers.py") in files, "its subpackages too"
    checkout = Path(inject.__file__).parent
    assert str(checkout) not in files, "nothing from the checkout"


def test_both_entry_points_run_from_the_copy(tmp_path: Path) -> None:
    inject.copy(tmp_path)
    run = (
        "import runpy; sys.argv = {argv!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    # As `python3 -m MODULE ARGS` in the pod: the launcher's main answers an unknown argument...
    launcher = isolated(
        tmp_path, run.format(argv=["launcher", "--bogus"], module="llm_operator.runtime.launcher")
    )
    assert (launcher.returncode, launcher.stderr) == (EXIT_USAGE, f"usage: {LAUNCHER} [drain]\n")
    # ...and the build entry point its help.
    build = isolated(tmp_path, run.format(argv=["build", "--help"], module="llm_operator.engine.build"))
    assert build.returncode == 0 and "--trtllm-version" in build.stdout, build.stderr


def test_a_module_that_needs_a_package_fails_the_check(tmp_path: Path) -> None:
    """The check above can fail: a copied module importing a third-party package does not import."""
    inject.copy(tmp_path)
    (tmp_path / "llm_operator/runtime/drain.py").write_text("import prometheus_client\n")
    done = isolated(tmp_path, "import llm_operator.runtime.launcher")
    assert done.returncode != 0 and "No module named 'prometheus_client'" in done.stderr


def test_each_shipped_library_is_pinned_to_the_version_installed() -> None:
    """The launcher tag covers the libraries' files: the operator's install and the image builder's
    environment must hold the same bytes, so pyproject.toml pins each to one version (the locks
    pin its files' hashes), and this environment has that version."""
    import importlib.metadata
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    pins = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for name in inject.LIBRARIES:
        (pin,) = [p for p in pins if p.split("==")[0].strip() == name]
        assert pin == f"{name}=={importlib.metadata.version(name)}", pin
        shipped = dict(inject.library_files(name))
        assert f"{name}/__init__.py" in shipped and f"{name}/{inject.LICENSE}" in shipped
        # Its metadata, for the launcher image's SBOM: the pinned version, beside the library.
        metadata = shipped[f"{name}-{importlib.metadata.version(name)}.dist-info/METADATA"].read_text()
        assert f"\nVersion: {importlib.metadata.version(name)}\n" in metadata


def test_an_installed_operator_tags_what_its_checkout_tags(tmp_path: Path) -> None:
    """Installed from its wheel (the operator image), the package lies in site-packages beside the
    installed h11, whose license is in its dist-info, not at its root: the tag is the checkout's,
    so the operator names the launcher image the builder pushed (a copy with its license beside the
    package, as in the launcher image, is read as it lies)."""
    import shutil

    import h11

    site = tmp_path / "site-packages"
    shutil.copytree(inject.PACKAGE, site / "llm_operator", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(h11.__file__).parent, site / "h11", ignore=shutil.ignore_patterns("__pycache__"))
    assert inject.content_tag(site / "llm_operator") == inject.content_tag()

    shipped = tmp_path / "launcher"
    inject.copy(shipped)
    assert inject.content_tag(shipped / "llm_operator") == inject.content_tag()
