"""YAML from people's files, read with bounds: size, documents, nesting; aliases refused while
PyYAML composes, so nothing expands (687 bytes of nested aliases grew to 5.9 GB before). Every
refusal is an InputError, one line `FILE: where: what`."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import yaml

MiB = 1024 * 1024
# Kubernetes objects nest a dozen levels; PyYAML composes recursively, so depth needs its bound.
MAX_NESTING = 64
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
