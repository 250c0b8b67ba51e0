"""The API keys of the OpenAI port (spec.routing.apiKeys): every key of the Secret the spec names,
mounted as a directory of files (one per Secret key, contract.API_KEYS_DIR).

A request carries one as `Authorization: Bearer KEY`, as the openai SDK sends its api_key. Each
check compares the presented key with every accepted one in constant time (hmac.compare_digest,
no early exit), so neither which key matched nor how much of one did shows in the time taken.
The kubelet updates a Secret volume in place (an atomic swap of its `..data` link): the keys are
read again once that link changes, looked at no more than once a second, so a key added to the
Secret is accepted and a removed one refused without a restart. Keys are never logged.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable
from pathlib import Path

RECHECK_SECONDS = 1.0
DATA_LINK = "..data"  # the kubelet's atomic-writer layout of a Secret volume


class ApiKeys:
    def __init__(self, directory: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._clock = clock
        self._keys: list[bytes] = []
        self._version: str | None = None
        self._checked = float("-inf")
        self._reload()

    def _current_version(self) -> str:
        """What changes when the kubelet swaps in new contents (or, for a plain directory, any
        file: tests and `llm-operator` run outside a pod)."""
        link = self.directory / DATA_LINK
        if link.is_symlink():
            return os.readlink(link)
        return ",".join(f"{p.name}:{p.stat().st_mtime_ns}" for p in sorted(self.directory.iterdir()))

    def _reload(self) -> None:
        self._version = self._current_version()
        keys = []
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            key = path.read_bytes().strip()
            if key:
                keys.append(key)
        self._keys = keys

    @property
    def count(self) -> int:
        return len(self._keys)

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked < RECHECK_SECONDS:
            return
        self._checked = now
        try:
            if self._current_version() != self._version:
                self._reload()
        except OSError:
            self._keys = []  # the volume went away: refuse everyone rather than serve without keys

    def accepts(self, authorization: str) -> bool:
        """Whether an Authorization header's value carries an accepted key."""
        self._refresh()
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = presented.strip().encode("utf-8", "surrogateescape")
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(given, key)
        return matched and bool(given)
