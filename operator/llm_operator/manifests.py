"""What the CLI reads from people's files: bounded, alias-free YAML, refused in one line.

A GitOps job may render every pull request with `llm-operator render`, so reading a file must stay
cheap whatever it holds: its size, document count and nesting are bounded, and YAML aliases are
refused on load (687 bytes of nested aliases grew to 5.9 GB before). Every refusal is one line,
`FILE: where: what`, that never repeats a value from the file: an env entry may carry a token.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from llm_operator.api.v1alpha1 import API_VERSION, GROUP, KIND, LLMDeployment

MiB = 1024 * 1024
# Far above any LLMDeployment manifest: the API server stores at most ~1.5 MiB per object.
MAX_MANIFEST_BYTES = 1 * MiB
# Documents, and objects (a List's items count one each): every LLMDeployment is planned and rendered.
MAX_MANIFEST_OBJECTS = 100
# `kubectl get nodes -o yaml` of a large cluster is tens of kilobytes per node.
MAX_NODES_BYTES = 32 * MiB
MAX_NODES_OBJECTS = 10_000
# Kubernetes objects nest a dozen levels; PyYAML composes recursively, so depth needs its bound.
MAX_NESTING = 64
# An input value this long or longer is masked wherever a message would repeat it.
MASK_MIN_LENGTH = 4

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
STDIN = "-"
URL_CREDENTIALS = re.compile(r"://[^/@\s]+@")


def one_line(text: str) -> str:
    """Control characters and line breaks (which a file name or key may hold) as escapes, and
    credentials in a URL (scheme://user:token@host) masked."""
    text = URL_CREDENTIALS.sub("://***@", text)
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class InputError(Exception):
    """A refused input: printed as `FILE: where: what`, the CLI then exits 1."""

    def __init__(self, source: str, where: str, what: str) -> None:
        super().__init__(f"{one_line(source)}: {one_line(where)}: {one_line(what)}")


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def read_text(path: str, max_bytes: int, stdin: Any = None) -> str:
    """The file's text (or stdin's, for "-"); at most max_bytes are read from anything."""
    source = display_name(path)
    try:
        if path == STDIN:
            data: bytes = stdin.buffer.read(max_bytes + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(source, "file", "does not exist") from None
    except IsADirectoryError:
        raise InputError(source, "file", "is a directory: name a YAML file (or - for stdin)") from None
    except OSError as e:
        raise InputError(source, "file", f"cannot be read ({e.strerror or type(e).__name__})") from None
    if len(data) > max_bytes:
        raise InputError(source, "file", f"is larger than {max_bytes // MiB} MiB, the limit for this input")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(source, f"byte {e.start}", "not UTF-8 text: give a YAML file") from None


class _PyParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


# libyaml's parser where PyYAML has it (4x faster on 1 MiB); composing stays PyYAML's, checked below.
_Parser: Any = _PyParser
with contextlib.suppress(ImportError):  # PyYAML built without libyaml
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]


class _Loader(yaml.composer.Composer, yaml.constructor.SafeConstructor, _Parser, yaml.resolver.Resolver):  # type: ignore[misc]
    """PyYAML's safe loader, refusing aliases and deep nesting while it composes."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            refusal = "YAML aliases (*name, also in << merges) are not accepted: write the value out"
            raise yaml.composer.ComposerError(None, None, refusal, mark)
        if self._depth == MAX_NESTING:
            raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_NESTING} levels deep", mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError):  # e.g. an unquoted date that is none, a 5,000-digit int
            kind = node.tag.rpartition(":")[2]
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot be read as a YAML {kind}: quote it if it is a string", node.start_mark
            ) from None


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"


def load_documents(source: str, text: str, max_documents: int) -> list[tuple[int, Any]]:
    """(1-based index, content) of every non-empty YAML document of the text."""
    docs: list[tuple[int, Any]] = []
    index = 0
    loader = None
    try:
        loader = _Loader(text)  # the pure-Python reader checks characters here
        while loader.check_node():
            index += 1
            if index > max_documents:
                raise InputError(
                    source, f"document {index}", f"more than {max_documents} documents: split the file"
                )
            doc = loader.get_data()
            if doc is not None:
                docs.append((index, doc))
    except yaml.MarkedYAMLError as e:
        raise InputError(source, _at(e.problem_mark), e.problem or e.context or "not valid YAML") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise InputError(
            source, f"line {line}", f"character #x{e.character:04x} is not allowed in YAML"
        ) from None
    except yaml.YAMLError as e:
        raise InputError(source, "YAML", f"not valid YAML ({type(e).__name__})") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not docs:
        raise InputError(source, "file", "holds no YAML document")
    return docs


def _kind_of(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a scalar"


@dataclass(frozen=True)
class Obj:
    """One Kubernetes object of a file: document `index`, or item `item` of a List there; `name`
    once it is known to be one."""

    index: int
    item: int | None
    body: dict[str, Any]
    name: str | None = None

    @property
    def where(self) -> str:
        item = f", items[{self.item}]" if self.item is not None else ""
        return f"document {self.index}{item}" + (f" ({self.name})" if self.name else "")

    def at(self, path: str) -> str:
        return f"{self.where}, {path}" if path else self.where


def load_objects(path: str, max_bytes: int, max_objects: int, stdin: Any = None) -> Iterator[Obj]:
    """Every object of the file (or stdin), List kinds (`kubectl get -o yaml`) expanded, at most
    max_objects of them; raises InputError."""
    source = display_name(path)
    count = 0
    for index, doc in load_documents(source, read_text(path, max_bytes, stdin), max_objects):
        listed = isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc
        items = doc["items"] if listed else [doc]
        if not isinstance(items, list):
            raise InputError(source, f"document {index}, items", "must be a list of objects")
        for item, body in enumerate(items):
            obj = Obj(index, item if listed else None, body)
            count += 1
            if count > max_objects:
                raise InputError(source, obj.where, f"more than {max_objects} objects: split the file")
            if not isinstance(body, dict):
                raise InputError(
                    source, obj.where, f"is {_kind_of(body)}, not a Kubernetes object (a mapping with kind)"
                )
            for field in ("apiVersion", "kind"):
                if not isinstance(body.get(field), str) or not body[field]:
                    raise InputError(source, obj.at(field), "is missing: every Kubernetes object has one")
            yield obj


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def mask(message: str, value: Any) -> str:
    """The message without any string of `value` long enough to be a secret."""
    for text in sorted(set(_strings(value)), key=len, reverse=True):
        if len(text) >= MASK_MIN_LENGTH:
            message = message.replace(text, "***")
    return message


def env_values(value: Any) -> list[str]:
    """Literal env values anywhere in a document: the one place the API takes a value that may be a
    secret (a token), masked even in the planner's own messages."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, v in value.items():
            if key == "env" and isinstance(v, list):
                found += [e["value"] for e in v if isinstance(e, dict) and isinstance(e.get("value"), str)]
            else:
                found += env_values(v)
    elif isinstance(value, list):
        for v in value:
            found += env_values(v)
    return found


def _path(doc: Any, loc: tuple[int | str, ...], missing: bool) -> str:
    """The error's location as a path in the document: pydantic's union branch names dropped (they
    are no key of the input), a missing field kept."""
    parts, here = [], doc
    for i, key in enumerate(loc):
        if isinstance(here, dict) and key in here:
            parts.append(f".{key}")
            here = here[key]
        elif isinstance(here, list) and isinstance(key, int) and 0 <= key < len(here):
            parts.append(f"[{key}]")
            here = here[key]
        elif missing and i == len(loc) - 1:
            parts.append(f".{key}")
    return "".join(parts).lstrip(".")


def field_errors(source: str, obj: Obj, doc: dict[str, Any], error: ValidationError) -> InputError:
    """The first field's errors (the others' paths named): messages only, never the input."""
    found: dict[str, list[str]] = {}
    for e in error.errors(include_url=False):
        path = _path(doc, e["loc"], e["type"] == "missing")
        message = mask(e["msg"].removeprefix("Value error, "), [e.get("input"), env_values(doc)])
        if message not in found.setdefault(path, []):
            found[path].append(message)
    (path, messages), *others = found.items()
    what = " or ".join(messages)
    if others:
        named = ", ".join(p or "the object" for p, _ in others[:3])
        what += f" (also wrong: {named}{', ...' if len(others) > 3 else ''})"
    return InputError(source, obj.at(path), what)


@dataclass(frozen=True)
class Deployment:
    obj: Obj
    ld: LLMDeployment

    @property
    def name(self) -> str:
        return self.ld.name

    @property
    def where(self) -> str:
        return self.obj.where


def _deployment(source: str, obj: Obj) -> Deployment:
    body = obj.body
    if body["apiVersion"] != API_VERSION:
        raise InputError(source, obj.at("apiVersion"), f"must be {API_VERSION}, the only version served")
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        raise InputError(source, obj.at("metadata.name"), "is missing: name the LLMDeployment")
    name, namespace = meta.get("name"), meta.get("namespace", "default")
    if name is None:
        raise InputError(source, obj.at("metadata.name"), "is missing: name the LLMDeployment")
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        raise InputError(
            source, obj.at("metadata.name"), "must be a DNS subdomain: a-z, 0-9, '-' and '.', at most 253"
        )
    if not isinstance(namespace, str) or len(namespace) > 63 or not DNS_LABEL.fullmatch(namespace):
        raise InputError(
            source, obj.at("metadata.namespace"), "must be a DNS label: a-z, 0-9 and '-', at most 63"
        )
    obj = replace(obj, name=name)
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) else ""
    # Render reads only these of metadata (owner references; the cluster sets the uid).
    doc = {
        **body,
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
    }
    try:
        return Deployment(obj, LLMDeployment.model_validate(doc))
    except ValidationError as e:
        raise field_errors(source, obj, doc, e) from None


def load_deployments(path: str, stdin: Any = None) -> tuple[list[Deployment], int]:
    """The LLMDeployments of a manifest file, and how many other objects it holds (skipped: a
    GitOps directory mixes kinds). Raises InputError."""
    source = display_name(path)
    found, skipped = [], 0
    for obj in load_objects(path, MAX_MANIFEST_BYTES, MAX_MANIFEST_OBJECTS, stdin):
        if obj.body["kind"] == KIND:
            found.append(_deployment(source, obj))
        elif obj.body["apiVersion"].partition("/")[0] == GROUP:
            raise InputError(source, obj.at("kind"), f"must be {KIND}, the only kind of {GROUP}")
        else:
            skipped += 1
    return found, skipped


class _Checked(BaseModel):
    """Only what the planner reads of a Node is checked; the rest passes."""

    model_config = ConfigDict(extra="allow", strict=True)


class _NodeMeta(_Checked):
    name: str
    labels: dict[str, str] | None = None


class _Taint(_Checked):
    key: str | None = None
    value: str | None = None
    effect: str


class _NodeSpec(_Checked):
    taints: list[_Taint] | None = None
    unschedulable: bool | None = None


class _NodeCondition(_Checked):
    type: str
    status: str


class _NodeStatus(_Checked):
    conditions: list[_NodeCondition] | None = None
    allocatable: dict[str, str | int] | None = None


class _Node(_Checked):
    metadata: _NodeMeta
    spec: _NodeSpec | None = None
    status: _NodeStatus | None = None


def load_nodes(path: str) -> list[dict[str, Any]]:
    """The Node objects of a `kubectl get nodes -o yaml` file, their planning fields checked."""
    source = display_name(path)
    nodes = []
    for obj in load_objects(path, MAX_NODES_BYTES, MAX_NODES_OBJECTS):
        if obj.body["kind"] != "Node":
            raise InputError(source, obj.at("kind"), "must be Node: give `kubectl get nodes -o yaml` output")
        try:
            _Node.model_validate(obj.body)
        except ValidationError as e:
            raise field_errors(source, obj, obj.body, e) from None
        nodes.append(obj.body)
    return nodes
