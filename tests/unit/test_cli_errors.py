"""Every bad input of the security review, through every command: one line `FILE: where: what` on
stderr, exit 1, nothing on stdout, no traceback, and never a secret from the file (an env entry's
value, a URL's credentials, a token), while names and paths are said as written. Cheap whatever
the file holds: nested aliases are refused before they expand."""

from __future__ import annotations

import contextlib
import copy
import io
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import manifests
from llm_operator.cli import main

REPO = Path(__file__).resolve().parents[2]
CPU = yaml.safe_load((REPO / "examples/cpu-reference.yaml").read_text())
GPU = yaml.safe_load((REPO / "examples/llama3-8b-h100.yaml").read_text())
SECRET = "hf_Zq8SECRETtokenDoNotPrint"
# FILE: where: what -- where names no colon (a document, a field path, a line and column)
LINE = re.compile(r"^(?P<file>[^:]+): (?P<where>[^:]+): (?P<what>\S.*)$")
BOMB = """apiVersion: llmoperator.io/v1alpha1
kind: LLMDeployment
metadata: {name: lol}
a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
spec: {model: *i, engine: *i, runtime: {env: *i}}
"""


def edited(base: dict[str, Any], edit: Callable[[dict[str, Any]], object]) -> str:
    doc = copy.deepcopy(base)
    edit(doc)
    return yaml.safe_dump(doc)


def with_env(*entries: dict[str, Any]) -> Callable[[dict[str, Any]], object]:
    return lambda d: d["spec"].setdefault("runtime", {}).__setitem__("env", list(entries))


@dataclass(frozen=True)
class Case:
    id: str
    content: str | bytes | None  # the -f file's content; None: the path given as is
    where: str  # expected where, a regular expression
    what: str  # expected in what
    path: str = "app.yaml"  # relative to the test's directory, or absolute
    nodes: str | bytes | None = None  # a --nodes file's content
    command: str = "render"
    missing_nodes: bool = False  # --nodes names a file that does not exist


def doc_case(id: str, edit: Callable[[dict[str, Any]], object], where: str, what: str, **kw: Any) -> Case:
    return Case(id, edited(CPU, edit), where, what, **kw)


GOOD = yaml.safe_dump(CPU)
TINY = r"document 1 \(tiny-llama\), "  # where, once metadata.name is valid
UNPLACEABLE = edited(GPU, lambda d: d["spec"].update(parallelism={"tensor": 64}))
# Refused at planning by the field's name: the URI, which may hold a secret, is not repeated.
NOT_PVC_WORDS = r"cannot be placed \(EngineStorageNotOnClaim\): engine.prebuilt.uri must be pvc://CLAIM/PATH"
NOT_PVC = edited(GPU, lambda d: d["spec"]["engine"]["prebuilt"].update(uri=f"s3://{SECRET}/engines"))
NODE_LIST = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"nvidia.com/gpu.count": 8}}}
    ],
}
# fmt: off
CASES = [
    # the file
    Case("missing file", None, "file", "does not exist", path="nowhere.yaml"),
    Case("directory", None, "file", "is a directory", path="."),
    Case("through a file", None, "file", "cannot be read (Not a directory)", path="/proc/self/status/x"),
    Case("unreadable", None, "file", "cannot be read", path="/proc/self/mem"),
    Case("endless stream", None, "file", "larger than 1 MiB", path="/dev/zero"),
    Case("oversized", "x: " + "y" * manifests.MAX_MANIFEST_BYTES, "file", "larger than 1 MiB"),
    Case("empty", "", "file", "no YAML document"),
    Case("only separators and comments", "# nothing\n---\n---\n", "file", "no YAML document"),
    Case("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "byte 0", "not UTF-8"),
    Case("latin-1", "metadata: {name: caf\xe9}".encode("latin-1"), "byte 20", "not UTF-8"),
    Case("control character", "a: b\x07c\n", "line 1", "not allowed in YAML"),
    Case("too many documents", "---\nkind: ConfigMap\n" * 101, "document 101", "more than 100 documents"),
    Case("too many objects", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        copy.deepcopy(CPU) for _ in range(101)]}), r"document 1, items\[100\]", "more than 100 objects"),
    # the YAML
    Case("unclosed bracket", "spec: {model: [a, b\n", "line 2, column 1", "expected"),
    Case("tab indentation", "spec:\n\tmodel: x\n", "line 2, column 1", "cannot start any token"),
    Case("mapping in a scalar", "a: b: c\n", "line 1, column 5", "not allowed in this context"),
    Case("unclosed quote", f'env: "{SECRET}\n', "line 2, column 1", "end of stream"),
    Case("nested aliases", BOMB, "line 5, column 8", "aliases"),
    Case("merge key", "base: &b {x: 1}\nspec:\n  <<: *b\n", "line 3, column 7", "aliases"),
    Case("deep nesting", "[" * 100 + "]" * 100, "line 1, column 65", "nested more than 64"),
    Case("impossible date", "when: 2024-13-45\n", "line 1, column 7", "timestamp: quote it"),
    Case("5000-digit int", "n: " + "9" * 5000, "line 1, column 4", "int: quote it"),
    Case("python tag", "!!python/object/apply:os.system [id]\n", "line 1, column 1", "constructor"),
    # the document
    Case("top-level list", "- kind: LLMDeployment\n", "document 1", "is a list, not a Kubernetes object"),
    Case("scalar", "just words\n", "document 1", "is a string, not a Kubernetes object"),
    Case("second document a number", GOOD + "---\n42\n", "document 2", "is a number"),
    doc_case("kind missing", lambda d: d.pop("kind"), "document 1, kind", "is missing"),
    doc_case("apiVersion missing", lambda d: d.pop("apiVersion"), "document 1, apiVersion", "is missing"),
    doc_case("unknown kind", lambda d: d.update(kind="LLMDeploymnt"), "document 1, kind",
             "must be LLMDeployment"),
    doc_case("unknown version", lambda d: d.update(apiVersion="llmoperator.io/v1"), "document 1, apiVersion",
             "must be llmoperator.io/v1alpha1"),
    doc_case("metadata missing", lambda d: d.pop("metadata"), "document 1, metadata.name", "is missing"),
    doc_case("metadata.name missing", lambda d: d["metadata"].pop("name"), "document 1, metadata.name",
             "is missing"),
    doc_case("metadata.name not DNS", lambda d: d["metadata"].update(name="Tiny_Llama"),
             "document 1, metadata.name", "DNS subdomain"),
    doc_case("metadata.name a number", lambda d: d["metadata"].update(name=7), "document 1, metadata.name",
             "DNS subdomain"),
    doc_case("namespace not DNS", lambda d: d["metadata"].update(namespace="a.b"),
             "document 1, metadata.namespace", "DNS label"),
    doc_case("spec missing", lambda d: d.pop("spec"), TINY + "spec", "Field required"),
    doc_case("spec a list", lambda d: d.update(spec=[1]), TINY + "spec", "valid dictionary"),
    doc_case("unknown field", lambda d: d["spec"].update(engin={}), TINY + "spec.engin", "Extra inputs"),
    doc_case("enum", lambda d: d["spec"]["engine"].update(precision="fp7"),
             TINY + "spec.engine.precision", "Input should be 'fp16'"),
    doc_case("wrong type", lambda d: d["spec"]["engine"].update(maxBatchSize="many"),
             TINY + "spec.engine.maxBatchSize", "valid integer"),
    doc_case("out of range", lambda d: d["spec"].update(replicas=-1), TINY + "spec.replicas",
             "greater than"),
    doc_case("int or auto", lambda d: d["spec"].update(parallelism={"tensor": "three"}),
             TINY + "spec.parallelism.tensor", "valid integer.* or Input should be 'auto'"),
    doc_case("several errors", lambda d: d["spec"].update(replicas=-1, engin={}), TINY + "spec.replicas",
             "also wrong: spec.engin"),
    # env entries carrying a token: never echoed
    doc_case("secret, reserved name", with_env({"name": "LLMOP_TOKEN", "value": SECRET}),
             TINY + r"spec.runtime.env\[0\].name", "pod contract"),
    doc_case("secret, unknown key", with_env({"name": "HF_TOKEN", "value": SECRET, "valu": SECRET}),
             TINY + r"spec.runtime.env\[0\].valu", "Extra inputs"),
    doc_case("secret, value a mapping", with_env({"name": "HF_TOKEN", "value": {"token": SECRET}}),
             TINY + r"spec.runtime.env\[0\].value", "valid string"),
    doc_case("secret, bad name", with_env({"name": f"{SECRET}=x", "value": SECRET}),
             TINY + r"spec.runtime.env\[0\].name", "String should match pattern"),
    Case("secret in a List", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        yaml.safe_load(edited(CPU, with_env({"name": "HF_TOKEN", "value": 5, "x": SECRET})))]}),
        r"document 1, items\[0\] \(tiny-llama\), spec.runtime.env\[0\].value", "valid string"),
    Case("List items not a list", "apiVersion: v1\nkind: List\nitems: {a: 1}\n", "document 1, items", "list"),
    # a credential in a URI is refused where it is, and not echoed
    doc_case("credentials in the model uri", lambda d: d["spec"]["model"]["source"].update(
             uri=f"https://user:{SECRET}@example.com/m"),
             r"document 1 \(tiny-llama\), spec\.model\.source\.uri", "must not carry credentials"),
    # specs that validate but cannot be placed
    Case("unplaceable", UNPLACEABLE, r"document 1 \(llama3-8b\)", "cannot be placed (InvalidParallelism)"),
    Case("unplaceable, model-repo", UNPLACEABLE, r"document 1 \(llama3-8b\)", "cannot be placed",
         command="model-repo"),
    Case("engine not on a claim", NOT_PVC, r"document 1 \(llama3-8b\)", NOT_PVC_WORDS),
    Case("engine not on a claim, model-repo", NOT_PVC, r"document 1 \(llama3-8b\)", NOT_PVC_WORDS,
         command="model-repo"),
    # --nodes
    Case("nodes: node pools, not Nodes", GOOD, "document 1, apiVersion", "is missing",
         nodes=(REPO / "e2e/cluster/gpu-node-pools.yaml").read_text()),
    Case("nodes: missing", GOOD, "file", "does not exist", missing_nodes=True),
    Case("nodes: label not a string", GOOD, r"document 1, items\[0\], metadata.labels.nvidia.com/gpu.count",
         "valid string", nodes=yaml.safe_dump(NODE_LIST)),
    Case("nodes: a Pod", GOOD, "document 1, kind", "must be Node",
         nodes="apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"),
    Case("nodes: aliases", GOOD, "line 5, column 8", "aliases", nodes=BOMB),
    Case("nodes: list of strings", GOOD, "document 1", "is a list", nodes="[a, b]\n"),
]
# fmt: on
SECRET_CASES = {c.id for c in CASES if SECRET in str(c.content) + str(c.nodes)}


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def argv_for(case: Case, tmp_path: Path) -> list[str]:
    path = tmp_path / case.path
    if isinstance(case.content, bytes):
        path.write_bytes(case.content)
    elif case.content is not None:
        path.write_text(case.content)
    argv = [case.command, "-f", str(path)]
    if case.missing_nodes:
        argv += ["--nodes", str(tmp_path / "no-nodes.yaml")]
    elif case.nodes is not None:
        nodes = tmp_path / "nodes.yaml"
        nodes.write_bytes(case.nodes) if isinstance(case.nodes, bytes) else nodes.write_text(case.nodes)
        argv += ["--nodes", str(nodes)]
    return argv + (["-o", str(tmp_path / "repo")] if case.command == "model-repo" else [])


def assert_one_line(code: int, out: str, err: str, case: Case) -> re.Match[str]:
    assert code == 1, err
    assert "Traceback" not in err and out == ""
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    line = LINE.match(err.rstrip("\n"))
    assert line, f"not FILE: where: what: {err!r}"
    assert re.fullmatch(case.where, line["where"]), line["where"]
    assert re.search(case.what, line["what"]) or case.what in line["what"], line["what"]
    assert SECRET not in err
    return line


def test_the_table_covers_the_review() -> None:
    assert len(CASES) >= 40 and len(SECRET_CASES) >= 6


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths: the line names the file as given
    argv = argv_for(case, tmp_path)
    if case.content is None:
        argv[2] = case.path
    started = time.monotonic()
    line = assert_one_line(*run(argv), case)
    assert time.monotonic() - started < 5, "refusals are cheap"
    blamed = argv[argv.index("--nodes") + 1] if case.nodes is not None or case.missing_nodes else argv[2]
    assert line["file"] == blamed


@pytest.mark.parametrize("command", ["render", "model-repo"])
def test_stdin_is_named(command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a: [1\n")))
    argv = [command, "-f", "-", *(["-o", str(tmp_path)] if command == "model-repo" else [])]
    code, _, err = run(argv)
    assert code == 1 and err.startswith("<stdin>: line 2, column 1: ") and len(err.splitlines()) == 1


def test_model_repo_output_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(GOOD)
    (tmp_path / "taken").write_text("a file, not a directory")
    taken = tmp_path / "taken"
    code, _, err = run(["model-repo", "-f", str(tmp_path / "app.yaml"), "-o", str(taken)])
    assert (code, err) == (1, f"{taken}: output directory: cannot be written (Not a directory)\n")
    assert not (tmp_path / "taken" / "ensemble").exists()


def test_a_bad_operator_setting_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(GOOD)
    monkeypatch.setenv("LLMOP_LEADER_ELECTION", "maybe")
    for argv in (["render", "-f", str(tmp_path / "app.yaml")], ["run"]):
        code, _, err = run(argv)
        assert code == 1, err
        assert err.startswith("environment: LLMOP_* settings: LLMOP_LEADER_ELECTION must be true or false")


def test_other_kinds_are_skipped_and_said(tmp_path: Path) -> None:
    """A GitOps directory mixes kinds: a file of other objects renders nothing, successfully."""
    (tmp_path / "pvc.yaml").write_text((REPO / "examples/engine-cache.yaml").read_text())
    code, out, err = run(["render", "-f", str(tmp_path / "pvc.yaml")])
    assert (code, out) == (0, "") and "no LLMDeployment (6 other objects)" in err
    (tmp_path / "both.yaml").write_text((REPO / "examples/engine-cache.yaml").read_text() + "---\n" + GOOD)
    code, out, err = run(["render", "-f", str(tmp_path / "both.yaml")])
    assert code == 0 and {o["kind"] for o in yaml.safe_load_all(out)} >= {"Service", "ConfigMap"}


def test_a_token_a_validator_would_repeat_is_masked() -> None:
    assert manifests.mask(f"not {SECRET} here", {"env": [SECRET]}) == "not *** here"
    short = manifests.mask("Input should be 'fp8'", "fp")
    assert short == "Input should be 'fp8'", "too short to be a secret"


def test_only_what_may_be_secret_is_masked() -> None:
    doc = {"spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "source": {"uri": "pvc://models/llama"}},
        "engine": {"backend": "pytorch", "prebuilt": {"uri": "https://fetcher:pa55word@example.com/e"}},
        "runtime": {"env": [{"name": "API_KEY", "value": "plain-looking-value"}],
                    "tokenizerUri": "https://example.com/t?X-Amz-Signature=abc123&X-Amz-Expires=60"},
        "notes": ["AKIAIOSFODNN7EXAMPLE", SECRET],
    }}  # fmt: skip
    said = manifests.mask(
        "the pytorch backend reads pvc://models/llama, not https://fetcher:pa55word@example.com/e or "
        "https://example.com/t?X-Amz-Signature=abc123&X-Amz-Expires=60 (env plain-looking-value, "
        f"keys AKIAIOSFODNN7EXAMPLE {SECRET}) for meta-llama/Llama-3.1-8B-Instruct",
        manifests.secrets(doc),
    )
    assert said == (
        "the pytorch backend reads pvc://models/llama, not https://***@example.com/e or "
        "https://example.com/t?*** (env ***, keys *** ***) for meta-llama/Llama-3.1-8B-Instruct"
    )


def test_a_refusal_through_the_cli_says_its_words_and_masks_credentials(tmp_path: Path) -> None:
    """Once, a pytorch deployment's refusal read "the *** backend reads its checkpoint from a
    directory, not ***": every string of the file was masked. Now only secrets are."""
    uri = f"s3://builder:{SECRET}@engines-bucket/llama"
    (tmp_path / "app.yaml").write_text(edited(GPU, lambda d: d["spec"]["engine"]["prebuilt"].update(uri=uri)))
    for command in (["render"], ["model-repo", "-o", str(tmp_path / "repo")]):
        code, out, err = run([*command, "-f", str(tmp_path / "app.yaml")])
        assert (code, out) == (1, ""), err
        assert err.endswith(
            "cannot be placed (EngineStorageNotOnClaim): engine.prebuilt.uri must be pvc://CLAIM/PATH (a "
            "ReadWriteMany PersistentVolumeClaim); object-store engine caches are not supported yet\n"
        ), err
        assert SECRET not in err


def test_nested_aliases_through_the_real_program_are_cheap(tmp_path: Path) -> None:
    """The review's 687-byte file took 160 s and 5.9 GB; limited to 2 GiB of address space, the
    program refuses it at once."""
    (tmp_path / "bomb.yaml").write_text(BOMB)

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", "bomb.yaml"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, preexec_fn=limit_memory,
    )  # fmt: skip
    assert time.monotonic() - started < 20, "a process start, not an expansion"
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "bomb.yaml: line 5, column 8: YAML aliases (*name, also in << merges) are not " \
                          "accepted: write the value out\n"  # fmt: skip


def test_without_libyaml_the_same_refusals(tmp_path: Path) -> None:
    """PyYAML built without libyaml: the pure-Python parser under the same checks."""
    cases = [
        c for c in CASES if c.id in ("nested aliases", "deep nesting", "impossible date", "control character")
    ]
    for case in cases:
        (tmp_path / f"{case.id}.yaml").write_text(str(case.content))
    probe = (
        "import sys; sys.modules['yaml.cyaml'] = None\n"  # what `import yaml` finds without libyaml
        "from llm_operator import bounded_yaml; assert bounded_yaml._Parser is bounded_yaml._PyParser\n"
        "from llm_operator.cli import main\n"
        "sys.exit(max(main(['render', '-f', name]) for name in sys.argv[1:]))"
    )
    names = [f"{case.id}.yaml" for case in cases]
    done = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == len(cases), done.stderr
    for case, line in zip(cases, lines, strict=True):
        parsed = LINE.match(line)
        assert parsed and re.fullmatch(case.where, parsed["where"]) and case.what in parsed["what"], line


def test_render_quotes_strings_that_other_yaml_parsers_read_as_numbers() -> None:
    """kubectl (Go, YAML 1.1) reads a plain `0578731095` as an integer and refuses it as a label
    value: a template hash of only digits must come out quoted, and text stays plain."""
    from llm_operator.cli import dump_objects

    out = dump_objects([{"hash": "0578731095", "port": "8080", "ratio": "1e3", "name": "tiny-llama"}])
    assert "hash: '0578731095'" in out and "port: '8080'" in out and "ratio: '1e3'" in out
    assert "name: tiny-llama" in out
    assert yaml.safe_load(out) == {"hash": "0578731095", "port": "8080", "ratio": "1e3", "name": "tiny-llama"}
