"""A bounded inference load on a serving Service, from inside the cluster's network namespace, and
Prometheus queries from the host: what the autoscaling e2e test and benchmark drive and observe.

The load is a fixed number of worker threads (each enters the namespace once) posting to Triton's
generate endpoint at a Service's ClusterIP, or with `openai_model` to the OpenAI API's
/v1/completions (port 8080: the serving pods' front door, or a router in front of them). Every
request opens its own connection, so kube-proxy picks a backend per request and new replicas get
traffic as soon as they are endpoints. It stops at `max_requests` or `max_seconds`, whichever
comes first: never an unbounded loop. With `pace_seconds` each worker starts at most one request
per that many seconds: a load that only has to be there (a canary's analysis) then leaves the
machine's cores to the cluster instead of taking as many as the model serves.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from e2e.cluster import netns

# How the CPU runtime's TEST-ONLY fault knob words the requests it fails on purpose.
INJECTED = "injected fault"


@dataclass
class LoadStats:
    ok: int = 0
    failed: int = 0
    injected: int = 0  # of the failed: by the fault knob (a canary made bad on purpose)
    errors: list[str] = field(default_factory=list)  # the first few failures, for the report
    failed_at: list[float] = field(default_factory=list)  # when each failure came (time.monotonic)

    @property
    def not_injected(self) -> int:
        """Failures nobody asked for: those a rollout must never cause."""
        return self.failed - self.injected


class Load:
    """`concurrency` workers posting to http://host:port/v2/models/<model>/generate in namespace
    `ns`; `set_concurrency` changes how many are active (at most the initial number)."""

    def __init__(
        self,
        ns: str,
        host: str,
        port: int,
        *,
        concurrency: int,
        max_requests: int,
        max_seconds: float,
        model: str = "ensemble",
        body: dict[str, Any] | None = None,
        timeout: float = 60.0,
        openai_model: str | None = None,
        pace_seconds: float = 0.0,
    ) -> None:
        self.ns, self.host, self.port, self.timeout = ns, host, port, timeout
        self.pace_seconds = pace_seconds
        if openai_model is None:
            self.path, self.answer = f"/v2/models/{model}/generate", "text_output"
            body = body or {"text_input": "Once upon a time", "max_tokens": 16}
        else:
            self.path, self.answer = "/v1/completions", "choices"
            body = body or {"model": openai_model, "prompt": "Once upon a time", "max_tokens": 16}
        self.body = json.dumps(body).encode()
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.stats = LoadStats()
        self._active = concurrency
        self._started = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = 0.0
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(concurrency)
        ]

    def __enter__(self) -> Load:
        self._deadline = time.monotonic() + self.max_seconds
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_concurrency(self, n: int) -> None:
        self._active = n

    def stop(self) -> LoadStats:
        """Stop starting requests and wait for those in flight."""
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join()
        return self.stats

    @property
    def done(self) -> bool:
        """True once it ran out of requests or time (or was stopped)."""
        return self._stop.is_set() or not any(t.is_alive() for t in self._threads)

    def _take(self) -> bool:
        with self._lock:
            if self._started >= self.max_requests or time.monotonic() > self._deadline:
                return False
            self._started += 1
            return True

    def _record(self, error: str | None) -> None:
        with self._lock:
            if error is None:
                self.stats.ok += 1
            else:
                self.stats.failed += 1
                self.stats.failed_at.append(time.monotonic())
                self.stats.injected += INJECTED in error
                if len(self.stats.errors) < (50 if INJECTED not in error else 10):
                    self.stats.errors.append(error)

    def _worker(self, index: int) -> None:
        netns.setns(self.ns)  # this thread only
        while not self._stop.is_set():
            if index >= self._active:
                time.sleep(0.1)
                continue
            if not self._take():
                return
            started = time.monotonic()
            self._record(self._request())
            self._stop.wait(self.pace_seconds - (time.monotonic() - started))

    def _request(self) -> str | None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(
                "POST", self.path, self.body, {"Content-Type": "application/json", "Connection": "close"}
            )
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                return f"HTTP {resp.status}: {data[:200]!r}"
            if self.answer not in json.loads(data):
                return f"no {self.answer} in {data[:200]!r}"
            return None
        except (OSError, ValueError, http.client.HTTPException) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            with contextlib.suppress(OSError):
                conn.close()


def prometheus_query(
    base_url: str, promql: str, timeout: float = 5.0
) -> dict[tuple[tuple[str, str], ...], float]:
    """An instant query: {sorted label pairs: value} (raises OSError/ValueError on failure)."""
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=timeout) as r:
        answer = json.loads(r.read())
    if answer.get("status") != "success":
        raise ValueError(f"query {promql!r}: {answer}")
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in answer["data"]["result"]}
