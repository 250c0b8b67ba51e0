"""Helpers for e2e tests against the embedded cluster or any cluster named by KUBECONFIG.

The pytest fixtures in tests/e2e/conftest.py are thin wrappers around these:

- `E2ECluster.for_session()` picks the cluster: the embedded one (started if needed) unless
  KUBECONFIG names another kubeconfig file, in which case that cluster is used as it is (no fake
  nodes are created there and nothing is started or stopped).
- `Kubectl` runs the kubectl binary with JSON in and out.
- `wait_for()` polls a probe and fails with what was waited for and the last observed state.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from e2e import operator_release
from e2e.cluster import addons
from e2e.cluster.launcher import Cluster
from e2e.cluster.state import DEFAULT_STATE_DIR

T = TypeVar("T")
Manifest = dict[str, Any] | list[dict[str, Any]] | str
NAMESPACE_LABEL = "llm-operator.dev/e2e"


class KubectlError(Exception):
    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"kubectl {' '.join(args)} failed ({returncode}): {self.stderr}")

    @property
    def not_found(self) -> bool:
        # kubectl: 'Error from server (NotFound): pods "x" not found'
        return "(NotFound)" in self.stderr


class WaitTimeout(AssertionError):
    """Raised by wait_for; an AssertionError so pytest reports it as a test failure."""


def _shorten(value: Any, limit: int = 2000) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"


def wait_for(
    what: str,
    probe: Callable[[], T],
    ok: Callable[[T], bool] = bool,
    *,
    timeout: float = 60.0,
    interval: float = 0.5,
) -> T:
    """Call `probe` until `ok(result)` holds; return that result.

    Exceptions from `probe` (object not there yet, API hiccup) count as observations, not failures.
    On timeout raises WaitTimeout("timed out after N s waiting for <what>; last observed: <state>").
    """
    deadline = time.monotonic() + timeout
    last: Any = "<nothing observed>"
    while True:
        try:
            result = probe()
            if ok(result):
                return result
            last = result
        except Exception as e:  # recorded, reported on timeout
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout:g} s waiting for {what}; last observed: {_shorten(last)}"
            )
        time.sleep(interval)


@contextlib.contextmanager
def local_http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (a free port) answering with `handler`: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The status condition of that type, or None."""
    for c in (obj or {}).get("status", {}).get("conditions", []) or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def is_true(obj: dict[str, Any] | None, type_: str) -> bool:
    c = condition(obj, type_)
    return c is not None and c.get("status") == "True"


def pod_ready(pod: dict[str, Any] | None) -> bool:
    return pod is not None and pod.get("status", {}).get("phase") == "Running" and is_true(pod, "Ready")


# What owns pods in a test namespace: the operator's objects and what they own.
WORKLOADS = "llmdeployments,deployments,replicasets,statefulsets,jobs"


def install(kubectl: Kubectl, objects: list[dict[str, Any]], what: str) -> None:
    """A controller's manifests, its CRDs first: the rest (its custom resources, webhooks naming
    them) is applied once they are Established."""
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    kubectl.apply(crds)
    names = [c["metadata"]["name"] for c in crds]
    wait_for(f"{what}'s CRDs Established", lambda: [kubectl.get("crd", n) for n in names],
             lambda found: all(is_true(c, "Established") for c in found))  # fmt: skip
    kubectl.apply([o for o in objects if o["kind"] != "CustomResourceDefinition"])


class Kubectl:
    """The kubectl binary bound to one kubeconfig. `kubectl("get", "pods")` returns the
    CompletedProcess; the other methods speak JSON. Failures raise KubectlError."""

    def __init__(self, kubeconfig: Path, binary: Path | str = "kubectl", timeout: float = 120.0) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.binary = str(binary)
        self.timeout = timeout

    def __call__(
        self, *args: str, input: str | None = None, namespace: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [*args] + ([f"--namespace={namespace}"] if namespace else [])
        try:
            proc = subprocess.run(
                [self.binary, f"--kubeconfig={self.kubeconfig}", *argv],
                input=input,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise KubectlError(argv, -1, f"timed out after {self.timeout:g} s") from e
        if check and proc.returncode != 0:
            raise KubectlError(argv, proc.returncode, proc.stderr)
        return proc

    def json(self, *args: str, namespace: str | None = None, input: str | None = None) -> Any:
        return json.loads(self(*args, "-o", "json", namespace=namespace, input=input).stdout)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        try:
            obj: dict[str, Any] = self.json("get", kind, name, namespace=namespace)
        except KubectlError as e:
            if e.not_found:
                return None
            raise
        return obj

    def items(
        self, kind: str, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        args = ["get", kind] + ([f"--selector={selector}"] if selector else [])
        items: list[dict[str, Any]] = self.json(*args, namespace=namespace)["items"]
        return items

    def apply(self, manifest: Manifest, namespace: str | None = None) -> list[dict[str, Any]]:
        """Server-side apply of a dict, a list of dicts or YAML text; returns the applied objects."""
        if isinstance(manifest, str):
            text = manifest
        else:
            items = manifest if isinstance(manifest, list) else [manifest]
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        out = self.json(
            "apply", "--server-side", "--field-manager=e2e-tests", "--force-conflicts", "-f", "-",
            namespace=namespace, input=text,
        )  # fmt: skip
        return list(out["items"]) if out.get("kind") == "List" else [out]

    def delete(
        self, kind: str, name: str, namespace: str | None = None, wait: bool = False, timeout: float = 60.0
    ) -> None:
        """Delete the object if it exists. wait=True returns once that object (by UID) is gone, also
        when a controller has already recreated the name: `kubectl delete --wait` can miss that."""
        before = self.get(kind, name, namespace) if wait else None
        self("delete", kind, name, "--ignore-not-found", "--wait=false", namespace=namespace)
        if before is not None:
            uid = before["metadata"]["uid"]
            wait_for(
                f"{kind} {name} (uid {uid}) to be deleted",
                lambda: self.get(kind, name, namespace),
                lambda obj: obj is None or obj["metadata"]["uid"] != uid,
                timeout=timeout,
                interval=0.2,
            )

    def delete_namespace(self, name: str, timeout: float = 120.0) -> None:
        """Delete namespace `name`, returning once no pod of it is left (nothing runs on or writes
        to the node for it: its hostPath directories can go). Its pods are deleted with a 1 s
        grace period, their owners first without a cascade, as the test that ran there is over: a
        serving pod's own grace period (60 s) is spent in its preStop drain and Triton's exit, and
        the namespace controller, finding pods left, looks again only after half of it
        (kubernetes/kubernetes pkg/controller/namespace/namespace_controller.go). A pod deleted
        before (by a test, or by the garbage collector) keeps its grace period: the kubelet does not
        cut a preStop hook short."""
        self("delete", WORKLOADS, "--all", "--cascade=orphan", "--wait=false", namespace=name)

        def no_pods() -> bool:
            if not self.items("pods", name):
                return True
            self("delete", "pods", "--all", "--grace-period=1", "--wait=false", namespace=name)
            return False

        wait_for(f"the pods of namespace {name} to be gone", no_pods, timeout=timeout)
        self("delete", "namespace", name, "--ignore-not-found", "--wait=false")

    def events(self, namespace: str, involved: str | None = None) -> list[dict[str, Any]]:
        """Core events of the namespace, optionally only those about the object named `involved`."""
        selector = [f"--field-selector=involvedObject.name={involved}"] if involved else []
        items: list[dict[str, Any]] = self.json("get", "events", *selector, namespace=namespace)["items"]
        return items

    def create_namespace(self, hint: str = "test", pod_security: str = "restricted") -> str:
        """A new uniquely named namespace (labelled llm-operator.dev/e2e=true), returned once its
        `default` ServiceAccount exists: pods are rejected until then. Pod Security admission
        enforces `pod_security` there (restricted unless a test's own pods need less), so a pod
        the operator renders that falls short of it is refused and its test fails."""
        base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40].rstrip("-") or "test"
        name = f"e2e-{base}-{secrets.token_hex(3)}"
        labels = {NAMESPACE_LABEL: "true"}
        for mode in ("enforce", "warn", "audit"):
            labels[f"pod-security.kubernetes.io/{mode}"] = pod_security
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        wait_for(
            f"ServiceAccount default in namespace {name}",
            lambda: self.get("serviceaccount", "default", name),
            timeout=30,
            interval=0.2,
        )
        return name


def _push_launcher_image(launcher: Cluster) -> None:
    """This checkout's launcher image: the tests' operators name it by the content hash of this
    checkout's injected files, and a warm cluster's registry holds the one its `up` pushed, of the
    files as they were then (a cached build and names the registry has cost a second)."""
    from images.builder.images import build

    launcher.push_images([build("launcher", log=lambda line: None)])


@dataclass
class E2ECluster:
    """The cluster a test session runs against.

    kubeconfig: admin kubeconfig path. kubectl: a Kubectl bound to it. embedded: True for the
    launcher's cluster (fake GPU node pools present, control-plane flags known), False for a
    cluster named by KUBECONFIG. launcher: the Cluster for the embedded one, else None.
    """

    kubeconfig: Path
    kubectl: Kubectl
    embedded: bool
    launcher: Cluster | None = None

    @classmethod
    def for_session(cls, state_dir: Path = DEFAULT_STATE_DIR) -> E2ECluster:
        """Decide and prepare the session's cluster (raises ClusterError if the embedded one fails)."""
        launcher = Cluster(state_dir)
        env = os.environ.get("KUBECONFIG")
        if env and Path(env).resolve() != launcher.kubeconfig:
            kubectl_bin = shutil.which("kubectl")
            if kubectl_bin is None:
                raise FileNotFoundError(
                    f"KUBECONFIG={env} names an external cluster but kubectl is not on PATH"
                )
            return cls(Path(env), Kubectl(Path(env), kubectl_bin), embedded=False)
        # The whole test world: a cluster `make demo` left with the core only gets the rest.
        launcher.up(session=os.getpid(), addons=addons.ALL)
        _push_launcher_image(launcher)
        if operator_release.uninstall(launcher):
            print("uninstalled the operator `make operator-up` installed: the tests run their own")
        return cls(
            launcher.kubeconfig,
            Kubectl(launcher.kubeconfig, launcher.bin_dir / "kubectl"),
            embedded=True,
            launcher=launcher,
        )

    def finish(self) -> None:
        """End of session: release this session's lease on the embedded cluster, which stops it
        if a test session started it and no other session still uses it. A cluster started by
        `make cluster-up` stays up."""
        if self.launcher is not None:
            self.launcher.release(os.getpid())

    def gpu_nodes(self, product: str | None = None) -> list[dict[str, Any]]:
        """Nodes advertising nvidia.com/gpu (optionally only that nvidia.com/gpu.product)."""
        nodes = self.kubectl.items("nodes", selector=f"nvidia.com/gpu.product={product}" if product else None)
        return [n for n in nodes if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0]
