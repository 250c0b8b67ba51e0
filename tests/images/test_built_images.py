"""The built images, run without a container runtime (tests/images/rootfs.py): each starts as its
config says and does its job. Builds are cached (images/README.md): the first run on a machine
takes minutes, later ones reuse the archives."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from llm_operator import cli, contract, inject
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import CPU_RUNTIME_PYTHON_PATH, weights_seed
from llm_operator.render.inject import INJECT_PATH, inject_init_container

from images.builder.images import build
from tests.images.rootfs import Rootfs, can_build, pid_one

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.images, pytest.mark.skipif(can_build() is not None, reason=str(can_build()))]
# The operator's runtime dependencies and its launcher: the serving image carries none of them (the
# pod's init container copies the launcher and the front door in, render/inject.py). jinja2 is not
# among them: the front door renders chat templates with it in the serving pod.
OPERATOR_ONLY = ("pydantic", "lightkube", "kopf", "prometheus_client", "llm_operator")
# The cpu-runtime image's xgrammar (guided decoding) imports pydantic.
NOT_IN_CPU_RUNTIME = tuple(m for m in OPERATOR_ONLY if m != "pydantic")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Rootfs]:
    unpacked: dict[str, Rootfs] = {}

    def get(name: str) -> Rootfs:
        if name not in unpacked:
            unpacked[name] = Rootfs.unpack(build(name), tmp_path_factory.mktemp(name) / "rootfs")
        return unpacked[name]

    return get


def inside(root: Path, path: str) -> Path:
    """`path` in the rootfs with its symlinks resolved there, not on this host (Debian's /var/run
    is a link to /run)."""
    here = root
    for part in Path(path).relative_to("/").parts:
        here = here / part
        if here.is_symlink():
            target = os.readlink(here)
            here = root / target.lstrip("/") if target.startswith("/") else here.parent / target
    return here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pause_runs_as_the_sandbox_and_exits_0_on_sigterm(image: Callable[[str], Rootfs]) -> None:
    pause = image("pause")
    assert [p for p in pause.path.rglob("*") if not p.is_dir()] == [pause.path / "pause"], "one static file"
    with pause.popen(pause.command()) as process:
        time.sleep(0.5)
        assert process.poll() is None, "pause must stay up until stopped"
        pid = pid_one(process.pid)
        assert re.search(r"^Uid:\s+65535\s", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
        os.kill(pid, signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_launcher_holds_the_injected_files_and_its_entrypoint_copies_them(
    image: Callable[[str], Rootfs],
) -> None:
    """Exactly the files the operator injects, byte for byte, and a static busybox; the init
    container's command (render/inject.py), which is also the image's entry point, copies them into
    the emptyDir as a non-root user, again over an earlier copy (a pod's sandbox restart)."""
    from e2e.cluster.containerd_images import image_names

    package = REPO / "operator" / "llm_operator"
    launcher = image("launcher")
    files = sorted(str(p.relative_to(launcher.path)) for p in launcher.path.rglob("*") if not p.is_dir())
    injected = {rel: source.read_bytes() for rel, source in inject.sources(package)}
    assert "h11/__init__.py" in injected, "the front door's HTTP/1.1 parser, from this environment"
    assert any(re.fullmatch(r"h11-[^/]+\.dist-info/METADATA", f) for f in injected), "h11's metadata too"
    source = launcher.path / inject.LAUNCHER_SOURCE.lstrip("/")
    sbom_inputs = ["var/lib/dpkg/status", "etc/os-release"]  # busybox named as the Debian package it is
    shipped = [str(source.relative_to(launcher.path) / f) for f in injected]
    assert files == sorted([inject.COPIER.lstrip("/"), *sbom_inputs, *shipped])
    assert {f: (source / f).read_bytes() for f in injected} == injected
    # Named by the operator's content hash of these files, as the operator names the image it runs.
    tag = inject.content_tag(package)
    assert tag == inject.content_tag()
    names = image_names(build("launcher"))
    assert f"localhost/llm-operator/launcher:{tag}" in names
    assert f"ghcr.io/llm-operator/llm-operator/launcher:{tag}" in names
    init = inject_init_container(f"launcher:{tag}")
    assert launcher.command() == init["command"]
    assert launcher.config["User"] == "65532:65532"
    empty_dir = launcher.path / INJECT_PATH.lstrip("/")
    empty_dir.mkdir(parents=True)
    empty_dir.chmod(0o777)  # as the kubelet makes an emptyDir
    for _ in range(2):
        done = launcher.run(init["command"])
        assert done.returncode == 0, done.stdout
        copied = {str(p.relative_to(empty_dir)): p.read_bytes() for p in empty_dir.rglob("*") if p.is_file()}
        assert copied == injected
    assert all(p.stat().st_uid == 65532 for p in empty_dir.rglob("*")), "written as the container's user"


def test_the_launcher_sbom_lists_busybox_and_the_shipped_libraries() -> None:
    """The launcher image has no package manager: its SBOM still names what it ships, busybox as
    Debian's package at this machine's version and each shipped library at its pinned version,
    as the release attests it (images/sbom.py reads the archive's layers)."""
    import importlib.metadata

    from images import sbom

    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "busybox-static"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    document = json.loads(sbom.sbom("launcher", "0.0.0-test", sbom.read_files(build("launcher"))))
    purls = sorted(c["purl"] for c in document["components"])
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    assert f"pkg:deb/debian/busybox-static@{version}?arch={arch.strip()}&distro=debian-12" in [
        p.replace("%3A", ":").replace("%2B", "+") for p in purls
    ], purls
    assert [p for p in purls if p.startswith("pkg:pypi/")] == [
        f"pkg:pypi/{name}@{importlib.metadata.version(name)}" for name in sorted(inject.LIBRARIES)
    ], purls


def tree(root: Path) -> dict[str, str]:
    """Relative path -> text of every file under root."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_operator_runs_its_cli_with_the_templates(image: Callable[[str], Rootfs], tmp_path: Path) -> None:
    operator = image("operator")
    assert operator.config["Entrypoint"] == ["llm-operator"]
    assert operator.config["Cmd"] == ["run", "--all-namespaces"]
    helped = operator.run(operator.command("run", "--help"))
    assert helped.returncode == 0, helped.stdout
    assert "--all-namespaces" in helped.stdout
    # The templates and model files ship inside the package: the image renders the example's model
    # repository on each contract of the CPU runtime as this checkout does.
    example = yaml.safe_load((REPO / "examples/cpu-reference.yaml").read_text())
    repos = {}
    for name in ("pytorch", "tensorrt-engine"):
        example["spec"]["engine"]["cpuReference"] = {"contract": name}
        app = tmp_path / f"{name}.yaml"
        app.write_text(yaml.safe_dump(example))
        shutil.copy(app, operator.path / "tmp/app.yaml")
        rendered = operator.run(operator.command("model-repo", "-f", "/tmp/app.yaml", "-o", f"/tmp/{name}"))
        assert rendered.returncode == 0, rendered.stdout
        assert cli.main(["model-repo", "-f", str(app), "-o", str(tmp_path / name)]) == 0
        repos[name] = tree(operator.path / "tmp" / name)
        assert repos[name] == tree(tmp_path / name)
    assert "tensorrt_llm/1/model.yaml" in repos["pytorch"]  # the llmapi model
    assert "ensemble/config.pbtxt" in repos["tensorrt-engine"]


def test_fetch_image_runs_the_fetcher_with_its_two_libraries_only(image: Callable[[str], Rootfs]) -> None:
    """The fetch Job's command (the image's entry point) runs as the Dockerfile's user, with boto3
    and huggingface_hub and nothing else of the operator's; a failure still writes its
    termination message."""
    fetch = image("fetch")
    assert fetch.config["Entrypoint"] == ["python3", "-m", "llm_operator.modelcache.fetch"]
    probe = (
        "import importlib.util, json, boto3, huggingface_hub, llm_operator.modelcache.fetch\n"
        f"print(json.dumps([m for m in {list(OPERATOR_ONLY[:4])!r} if importlib.util.find_spec(m)]))"
    )
    imported = fetch.run(["python3", "-c", probe])
    assert imported.returncode == 0, imported.stdout
    assert json.loads(imported.stdout.splitlines()[-1]) == []
    failed = fetch.run(fetch.command("--uri", "gs://b/p", "--source-key", "gs-0123456789abcdef",
                                     "--cache-root", "/tmp", "--termination-log", "/tmp/result"))  # fmt: skip
    assert failed.returncode == 78, failed.stdout
    assert json.loads((fetch.path / "tmp/result").read_text())["reason"] == "SourceNotFound"


def test_cpu_runtime_has_the_model_but_not_the_launcher(image: Callable[[str], Rootfs]) -> None:
    runtime = image("cpu-runtime")
    probe = (
        "import importlib.util, json, sys, torch, numpy\n"
        # The model's own package, from where its python_path parameter points.
        f"sys.path.insert(0, {CPU_RUNTIME_PYTHON_PATH[0]!r})\n"
        "import llm_operator.runtime.cpu_reference.tiny_lm\n"
        "sys.path.pop(0); [sys.modules.pop(m) for m in list(sys.modules) if m.startswith('llm_operator')]\n"
        f"print(json.dumps([m for m in {list(NOT_IN_CPU_RUNTIME)!r} if importlib.util.find_spec(m)]))"
    )
    imported = runtime.run(["python3", "-c", probe])
    assert imported.returncode == 0, imported.stdout
    assert json.loads(imported.stdout.splitlines()[-1]) == [], "the serving image must not carry these"
    tritonserver = runtime.run([runtime.env["LLMOP_TRITONSERVER"], "--help"])
    assert "--model-repository" in tritonserver.stdout, tritonserver.stdout[-2000:]
    stub = Path(runtime.env["LLMOP_BACKEND_DIR"].lstrip("/")) / "python/triton_python_backend_stub"
    assert (runtime.path / stub).is_file()


# What each image's processes import as they start: the operator (and the waker it also runs), the
# fetch Job, the serving pod's model (with the python_path its model parameter sets; xgrammar as its
# first guided request imports it) and its front door's libraries.
START_UP_IMPORTS = {
    "operator": ("", "import llm_operator.cli, llm_operator.controller.handlers, llm_operator.waker.server"),
    "fetch": ("", "import boto3, huggingface_hub, llm_operator.modelcache.fetch"),
    "cpu-runtime": (
        CPU_RUNTIME_PYTHON_PATH[0],
        "import numpy, torch, tokenizers, jinja2, safetensors, gguf\n"
        "import llm_operator.runtime.cpu_reference.engine\n"
        "from llm_operator.runtime.cpu_reference.structured import guided\n"
        "guided._xgrammar()",
    ),
}


@pytest.mark.parametrize("name", sorted(START_UP_IMPORTS))
def test_every_module_a_process_starts_with_is_compiled_in_the_image(
    image: Callable[[str], Rootfs], name: str
) -> None:
    """Pods write no bytecode (PYTHONDONTWRITEBYTECODE, read-only roots): without the image's own,
    every start compiles all it imports again (2 to 4 s of CPU per serving pod process)."""
    path, modules = START_UP_IMPORTS[name]
    probe = (
        "import importlib.util, json, os, sys\n"
        f"sys.path[:0] = {[path] if path else []!r}\n"
        f"{modules}\n"
        "files = [getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]\n"
        "sources = [f for f in files if f.endswith('.py')]\n"
        "print(json.dumps([len(sources), sorted(f for f in sources\n"
        "    if not os.path.exists(importlib.util.cache_from_source(f)))]))"
    )
    imported = image(name).run(["python3", "-c", probe])
    assert imported.returncode == 0, imported.stdout
    count, uncompiled = json.loads(imported.stdout.splitlines()[-1])
    assert count > 100, f"the probe imported too little to tell: {count} modules"
    assert uncompiled == [], f"{len(uncompiled)} of {count} modules without bytecode: {uncompiled[:10]}"


def test_cpu_runtime_reads_a_checkpoint_as_the_host_writes_it(image: Callable[[str], Rootfs]) -> None:
    """The image's safetensors and torch load a cached checkpoint (seed 1) into the same model the
    host's builtin seed 1 is: same text."""
    from llm_operator.runtime.cpu_reference import TINY_MODELS, checkpoint
    from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

    runtime = image("cpu-runtime")
    checkpoint.write(runtime.path / "tmp/model", seed=1)
    probe = (
        f"import sys; sys.path.insert(0, {CPU_RUNTIME_PYTHON_PATH[0]!r})\n"
        "from llm_operator.runtime.cpu_reference import checkpoint\n"
        "print(''.join(checkpoint.load('/tmp/model').generate('cache', 12)))"
    )
    loaded = runtime.run(["python3", "-c", probe])
    assert loaded.returncode == 0, loaded.stdout
    expected = "".join(TinyLM(TINY_MODELS["tiny-llama"], 1).generate("cache", 12))
    assert loaded.stdout.splitlines()[-1] == expected


def test_cpu_runtime_serves_its_packaged_model_from_its_own_files(image: Callable[[str], Rootfs]) -> None:
    """The image's base layer holds SmolLM2's GGUF and its build wrote the tokenizer beside it: the
    image's own torch, gguf and tokenizers load them as the pod's model does, and the model answers
    a factual question in words."""
    runtime = image("cpu-runtime")
    probe = (
        f"import sys; sys.path.insert(0, {CPU_RUNTIME_PYTHON_PATH[0]!r})\n"
        "from llm_operator.runtime.cpu_reference import served\n"
        "from llm_operator.runtime.cpu_reference.tiny_lm import Sampler\n"
        "lm, codec = served.load('smollm2-135m-instruct', 0, '')\n"
        "prompt = codec.encode('<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n'\n"
        "                      '<|im_start|>assistant\\n')\n"
        "pieces = codec.pieces()\n"
        "sampler = Sampler(pickable=lm.pickable, end_id=lm.end_id)\n"
        "print(repr(''.join(pieces(t) for t in lm.generate_ids(prompt, 24, sampler))))"
    )
    answered = runtime.run(["python3", "-c", probe], timeout=300)
    assert answered.returncode == 0, answered.stdout[-3000:]
    assert "Paris" in answered.stdout.splitlines()[-1], answered.stdout[-500:]


def test_cpu_runtime_guides_with_its_own_xgrammar(image: Callable[[str], Rootfs]) -> None:
    """The image's xgrammar (installed without transformers, which guided.py stands in for) guides
    the tiny model to an object of a schema, and compiles one for SmolLM2's tokenizer."""
    runtime = image("cpu-runtime")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    probe = (
        f"import importlib.util, json, sys; sys.path.insert(0, {CPU_RUNTIME_PYTHON_PATH[0]!r})\n"
        "without = importlib.util.find_spec('transformers') is None\n"
        "from llm_operator.runtime.cpu_reference import packaged_dir, served\n"
        "from llm_operator.runtime.cpu_reference.decoding import Limits, Sampling, job, steps\n"
        "from llm_operator.runtime.cpu_reference.structured.guided import Matcher, Vocabulary\n"
        "lm, codec = served.load('tiny-llama', 1, '')\n"
        "vocabulary = Vocabulary.of_bytes(lm.embed.shape[0])\n"
        f"grammar = vocabulary.grammar('json_schema', {json.dumps(schema)!r})\n"
        "one = job(lm, codec, Limits(64, 256), None, 'x', Sampling(max_tokens=50, top_k=256), stream=False,\n"
        "          exclude_input=True, guide=Matcher(grammar, vocabulary.vocab_size))\n"
        "steps(lm, [one], lambda j, p: None, lambda b, a: None)\n"
        "smol = packaged_dir('smollm2-135m-instruct') + '/tokenizer.json'\n"
        "Vocabulary.of_tokenizer(smol, 49152, [2]).grammar('json_schema', '{\"type\": \"object\"}')\n"
        "print(json.dumps([without, one.finish_reason, one.generated]))"
    )
    guided = runtime.run(["python3", "-c", probe], timeout=300)
    assert guided.returncode == 0, guided.stdout[-3000:]
    no_transformers, finish, text = json.loads(guided.stdout.splitlines()[-1])
    assert no_transformers and finish == "stop" and set(json.loads(text)) == {"ok"}


def test_cpu_runtime_has_the_front_doors_tokenizer_and_chat_templates(image: Callable[[str], Rootfs]) -> None:
    """The image's own python3, with the front door copied in as the pod's init container does,
    loads the cpu-reference tokenizer directory written at build time, counts the model's byte ids
    and renders its chat template; its HTTP/1.1 (h11) is the copy's."""
    from llm_operator.runtime.cpu_reference.tiny_lm import encode

    runtime = image("cpu-runtime")
    inject.copy(inside(runtime.path, INJECT_PATH))
    text = "Grüß dich 🙂"
    probe = (
        "from llm_operator import contract\n"
        "from llm_operator.frontdoor.chat import render_chat\n"
        "from llm_operator.frontdoor.tokenizer import Tokenizer\n"
        "from llm_operator.frontdoor import http1\n"
        "print(http1.h11.__file__)\n"
        "tok = Tokenizer.load(contract.CPU_REFERENCE_TOKENIZER_DIR)\n"
        f"text = {text!r}\n"
        "print(tok.count(text))\n"
        "print(repr(render_chat(tok.chat_template, [{'role': 'user', 'content': text}])))"
    )
    rendered = runtime.run(["python3", "-c", probe], {"PYTHONPATH": INJECT_PATH})
    assert rendered.returncode == 0, rendered.stdout
    h11_file, count, chat = rendered.stdout.splitlines()[-3:]
    assert h11_file == f"{INJECT_PATH}/h11/__init__.py"
    assert int(count) == len(encode(text)) == 16
    assert chat == repr(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture
def model_repo_src(image: Callable[[str], Rootfs], tmp_path: Path) -> Iterator[str]:
    """The cpu-reference repository as the pod gets it: ConfigMap keys (`/` written as `__`) in a
    directory inside the image's rootfs."""
    rendered = tmp_path / "rendered"
    assert cli.main(["model-repo", "-f", str(REPO / "examples/cpu-reference.yaml"), "-o", str(rendered)]) == 0
    runtime = image("cpu-runtime")
    src = runtime.path / "etc/llm-operator/model-repo"
    src.mkdir(parents=True)
    for path in rendered.rglob("*"):
        if path.is_file():
            shutil.copy(path, src / str(path.relative_to(rendered)).replace("/", "__"))
    yield "/etc/llm-operator/model-repo"
    shutil.rmtree(src)


def tiny_llama_answer(prompt: str, max_tokens: int) -> str:
    """What the example's model answers, greedily: the same model run in this process."""
    from llm_operator.runtime.cpu_reference import TINY_MODELS
    from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

    spec = LLMDeploymentSpec.model_validate(
        yaml.safe_load((REPO / "examples/cpu-reference.yaml").read_text())["spec"]
    )
    lm = TinyLM(TINY_MODELS["tiny-llama"], weights_seed(spec.model.revision or "main"))
    return "".join(lm.generate(prompt, max_tokens))


def test_cpu_runtime_launcher_serves_the_cpu_reference_model(
    image: Callable[[str], Rootfs], model_repo_src: str
) -> None:
    runtime = image("cpu-runtime")
    # What the pod's init container does: the launcher into the emptyDir on PYTHONPATH.
    inject.copy(inside(runtime.path, INJECT_PATH))
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {
        "PYTHONPATH": INJECT_PATH,
        "LLMOP_MODEL_REPO_SRC": model_repo_src,
        "LLMOP_MODEL_REPO": "/tmp/model-repo",  # an emptyDir in the pod
        "LLMOP_HTTP_PORT": str(http),
        "LLMOP_GRPC_PORT": str(grpc),
        "LLMOP_METRICS_PORT": str(metrics),
    }
    log = Path(runtime.path / "tmp/launcher.log")
    with (
        log.open("w") as out,
        runtime.popen(list(contract.CONTAINER_COMMAND), env, stdout=out, stderr=subprocess.STDOUT) as process,
    ):
        try:
            deadline = time.monotonic() + 180
            ready = False
            while not ready and time.monotonic() < deadline and process.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                        ready = r.status == 200
                except OSError:
                    time.sleep(1)
            assert ready, f"not ready (exit {process.poll()}):\n{log.read_text()[-4000:]}"
            # The example's default contract: the llmapi model, upstream's inputs, greedy by default.
            request = json.dumps({"text_input": "hello", "sampling_param_max_tokens": 4,
                                  "sampling_param_exclude_input_from_output": True}).encode()  # fmt: skip
            with urllib.request.urlopen(
                urllib.request.Request(
                    f"http://127.0.0.1:{http}/v2/models/tensorrt_llm/generate", data=request
                ),
                timeout=30,
            ) as r:
                assert json.loads(r.read())["text_output"] == tiny_llama_answer("hello", 4)
            # SIGTERM (what the kubelet sends) stops the launcher and its server cleanly.
            os.kill(pid_one(process.pid), signal.SIGTERM)
            assert process.wait(timeout=60) == 0, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
