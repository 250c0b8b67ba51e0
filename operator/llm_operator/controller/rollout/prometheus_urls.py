"""The Prometheus endpoints canary analysis may query: the operator's allowlist (pure).

The operator GETs `{url}/api/v1/query` from its own pod, so a URL taken from a spec as it is
would let whoever may create an LLMDeployment make the operator request any address its pod
reaches. Only endpoints the operator's configuration lists (LLMOP_ANALYSIS_PROMETHEUS_URLS, the
chart's `operator.analysisPrometheusUrls`) are queried, and always in the list's own canonical
form, never the spec's string (so two URL parsers cannot disagree about where it goes).

A URL matches an entry when both parse and their normalised parts are equal:
- scheme http or https, case-insensitive;
- host compared case-insensitively; `host.` (a trailing dot) is another host;
- port as written, or the scheme's default (80, 443);
- path with its trailing slashes removed (`http://p:9090/` is `http://p:9090`).
Never a match: user information (`user@`), a query or a fragment (even an empty `?` or `#`),
percent-encoding, backslashes, whitespace, control or non-ASCII characters.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from llm_operator.api.v1alpha1 import CanaryAnalysis
from llm_operator.plan.types import PlanningError

DEFAULT_PORTS = {"http": 80, "https": 443}
# Whatever could make two parsers read one string differently is refused, not normalised.
_REFUSED = re.compile(r"[^\x21-\x7e]|[\\%]")


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str  # "" or "/a/b", no trailing slash

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse(url: str) -> Endpoint:
    """The URL's endpoint; ValueError says what is wrong in words that never quote the URL."""
    if _REFUSED.search(url):
        raise ValueError("has whitespace, control, non-ASCII, backslash or percent-encoded characters")
    if "?" in url or "#" in url:
        raise ValueError("has a query or a fragment")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("is not an http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError("has user information (user@)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has a port that is not a number from 1 to 65535") from None
    host = (parts.hostname or "").lower()
    if not host or port == 0:
        raise ValueError("has no host" if not host else "has a port that is not a number from 1 to 65535")
    return Endpoint(scheme, host, port or DEFAULT_PORTS[scheme], parts.path.rstrip("/"))


def parse_list(text: str, source: str) -> tuple[Endpoint, ...]:
    """Endpoints separated by commas or whitespace (from `source`, the setting's name)."""
    out = []
    for i, url in enumerate(u for u in re.split(r"[,\s]+", text) if u):
        try:
            out.append(parse(url))
        except ValueError as e:
            raise ValueError(f"{source}: entry {i + 1} {e}") from None
    return tuple(dict.fromkeys(out))


def allowed(url: str, allowlist: Sequence[Endpoint]) -> Endpoint | None:
    """The allowlist's entry that `url` names, or None; ValueError when `url` cannot be one."""
    endpoint = parse(url)
    return endpoint if endpoint in allowlist else None


ANALYSIS_URL = "spec.rollout.canary.analysis.prometheus.url"


def analysis_endpoint(analysis: CanaryAnalysis, allowlist: tuple[Endpoint, ...]) -> str:
    """The allowed endpoint that the spec's analysis URL names (its canonical URL, what is
    queried); PlanningError, before anything is queried, when it names none. The spec's URL is
    never repeated (it may hold a token); the allowed ones are the operator's own settings."""
    try:
        endpoint = allowed(analysis.prometheus.url, allowlist)
        why = ""
    except ValueError as e:
        endpoint, why = None, f" {e}, so it"
    if endpoint is not None:
        return endpoint.url
    choices = ", ".join(e.url for e in allowlist[:3]) + (" ..." if len(allowlist) > 3 else "")
    raise PlanningError(
        "AnalysisEndpointNotAllowed",
        f"{ANALYSIS_URL}{why} is not among the operator's allowed analysis endpoints "
        f"({choices or 'none are configured'}): use one of them, or have the operator's administrator "
        "add it to the chart value operator.analysisPrometheusUrls (LLMOP_ANALYSIS_PROMETHEUS_URLS)",
    )
