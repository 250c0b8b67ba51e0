"""What the CLI reads from people's files: LLMDeployments and Nodes, checked, refused in one line.

A GitOps job may render every pull request with `llm-operator render`, so reading a file must stay
cheap whatever it holds (bounded_yaml.py) and every refusal is one line, `FILE: where: what`, that
never repeats what in the file may be a secret (`secrets`): env values, a URL's credentials or
query, token-shaped strings. Names, URIs and paths are said as written: the reader needs them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from llm_operator.api.v1alpha1 import API_VERSION, GROUP, KIND, LLMDeployment
from llm_operator.bounded_yaml import InputError, MiB, display_name, load_documents, read_text
from llm_operator.labels import TRTLLM_VERSION

# Far above any LLMDeployment manifest: the API server stores at most ~1.5 MiB per object.
MAX_MANIFEST_BYTES = 1 * MiB
# Documents, and objects (a List's items count one each): every LLMDeployment is planned and rendered.
MAX_MANIFEST_OBJECTS = 100
# `kubectl get nodes -o yaml` of a large cluster is tens of kilobytes per node.
MAX_NODES_BYTES = 32 * MiB
MAX_NODES_OBJECTS = 10_000
# A secret this long or longer is masked wherever a message would repeat it.
MASK_MIN_LENGTH = 4
# In any string of a document: a URL's user:password@ and its ?query (a presigned URL's signature).
_URL_SECRETS = re.compile(r"://([^/@\s]+)@|://[^?\s]*\?(\S+)")
# Tokens by their published prefixes: Hugging Face, GitHub, GitLab, Slack, OpenAI-style keys, AWS
# access key ids.
_TOKENS = re.compile(
    r"\b(?:hf_|gh[opsur]_|github_pat_|glpat-|xox[abpr]-|sk-)[A-Za-z0-9_-]{8,}|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"
)

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


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


def secrets(document: Any) -> list[str]:
    """What a message must not repeat from `document`: env values, URL credentials and queries,
    token-shaped strings. Not backend names, model names, claims or paths."""
    found = env_values(document)
    for text in _strings(document):
        found += [m for pair in _URL_SECRETS.findall(text) for m in pair if m]
        found += _TOKENS.findall(text)
    return found


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
        message = mask(e["msg"].removeprefix("Value error, "), secrets(doc))
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
    # Render reads only these of metadata (owner references; the cluster sets the uid), and the
    # release recorded on the deployment (release_pin.py).
    doc = {
        **body,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": _release(source, obj, meta),
        },
    }
    try:
        return Deployment(obj, LLMDeployment.model_validate(doc))
    except ValidationError as e:
        raise field_errors(source, obj, doc, e) from None


def _release(source: str, obj: Obj, meta: dict[str, Any]) -> dict[str, str]:
    """The release annotation of a manifest, if it has one: a string, as the API server wants."""
    annotations = meta.get("annotations") or {}
    version = annotations.get(TRTLLM_VERSION) if isinstance(annotations, dict) else None
    if version is None:
        return {}
    if not isinstance(version, str):
        what = f"must be a string (the API server refuses other annotation values): quote it, '{version}'"
        raise InputError(source, obj.at(f"metadata.annotations.{TRTLLM_VERSION}"), what)
    return {TRTLLM_VERSION: version}


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
