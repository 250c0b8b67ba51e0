"""Faults of a group's members on the real node, for tests/e2e/test_cpu_multi_node.py and
bench/groups.py: a signal sent to a
process in a pod by `kubectl exec`, the deployment's GroupRecreated Events since a moment, and
another deployment asked over and over while a fault runs, and what the pods said."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import openai
import yaml

from e2e.cluster.testing import Kubectl

# What signal_in finds, by the words of their argv:
RANK = "llm_operator.runtime.cpu_reference.launch"  # a later stage (cpu_reference/launch.py)
AGENT = "llm_operator.runtime.launch_agent,--serve"  # a worker's launch agent (runtime/commands.py)
TRITON = "--id=rank0"  # a single pod's tritonserver (runtime/commands.py rank_args)

# Run in a pod's container by `kubectl exec`: signal every process whose command line holds all of
# the comma-separated strings (signal 0: only count them); prints their PIDs. The cpu-runtime image has
# python3 and no procps.
SIGNAL = """
import os, sys
want, sig = sys.argv[1].split(","), int(sys.argv[2])
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        line = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").replace("\\0", " ")
    except OSError:
        continue
    if int(pid) != os.getpid() and all(w in line for w in want):
        found.append(int(pid))
for pid in found:
    os.kill(pid, sig)
print(" ".join(map(str, found)))
"""

# The container's processes: pid, parent, argv (what a failure shows).
TREE = """
import os
for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):
    try:
        ppid = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
        argv = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        continue
    print(pid, ppid, argv[:200])
"""


def signal_in(
    kubectl: Kubectl, namespace: str, pod: str, argv: str, sig: int, check: bool = True
) -> list[int]:
    """Signal the processes of `pod` whose argv holds `argv`'s words; their PIDs (with check=False,
    none where the pod is gone)."""
    # The namespace before `--`: Kubectl appends namespace= after everything, the command's too.
    out = kubectl("exec", "-n", namespace, pod, "-c", "triton", "--", "python3", "-c", SIGNAL, argv,
                  str(sig), check=check)  # fmt: skip
    return [int(pid) for pid in out.stdout.split()] if out.returncode == 0 else []


def new_group_events(
    kubectl: Kubectl, namespace: str, deployment: str, seen: set[tuple[str, int]]
) -> list[dict[str, Any]]:
    """GroupRecreated Events of the deployment not in `seen` ((name, count) of earlier ones)."""
    events = [e for e in kubectl.events(namespace, deployment) if e.get("reason") == "GroupRecreated"]
    return [e for e in events if (e["metadata"]["name"], e.get("count", 1)) not in seen]


def group_events(kubectl: Kubectl, namespace: str, deployment: str) -> set[tuple[str, int]]:
    return {
        (e["metadata"]["name"], e.get("count", 1))
        for e in new_group_events(kubectl, namespace, deployment, set())
    }


class Other:
    """Asks a deployment over and over in a thread of its own while a fault runs elsewhere: every
    answer must be the reference text."""

    def __init__(self, answer: Callable[[], str], want: str) -> None:
        self.answer, self.want, self.asked, self.failed = answer, want, 0, list[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        while not self._stop.is_set():
            try:
                text = self.answer()
            except (openai.APIError, OSError) as e:
                text = f"{type(e).__name__}: {e}"
            self.asked += 1
            if text != self.want:
                self.failed.append(text)
            self._stop.wait(0.5)

    def __enter__(self) -> Other:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def what_the_pods_said(kubectl: Kubectl, namespace: str) -> str:
    """Each pod's state, its last log lines (the previous container's too) and the namespace's
    Events: what a failure on the real node needs to be understood after the namespace is gone."""
    out = []
    for pod in kubectl.items("pods", namespace):
        name = pod["metadata"]["name"]
        out.append(f"--- {name}: {yaml.safe_dump(pod.get('status', {}).get('containerStatuses'))}")
        for previous in ("--previous=false", "--previous=true"):
            got = kubectl("logs", name, "--all-containers", previous, "--tail=60", namespace=namespace,
                          check=False)  # fmt: skip
            out.append(f"logs {previous}: {got.stdout}{got.stderr}")
    for event in kubectl.events(namespace):
        about = event.get("involvedObject", {}).get("name")
        out.append(f"event {event.get('reason')} {about}: {event.get('message')}")
    return "\n".join(out)
