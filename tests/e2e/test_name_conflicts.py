"""No adoption, on the real API server: objects someone else made under the names of a deployment's
children are neither rewritten nor taken over (issue 38, item 3).

Server-side apply with force takes over whatever holds the name: it rewrites the object, adds the
deployment's controller reference (the garbage collector then deletes it with the deployment) and
prunes it when the spec stops rendering it. Here a Service, a NetworkPolicy, a ServiceAccount, a
Role and a RoleBinding wait under the names a routed deployment renders (its client Service and
policy, its router's identity); the deployment is Stalled with reason NameConflict naming each,
every one of them stays exactly as it was (resourceVersion included), nothing serving is created,
and once they are deleted the deployment gets its own children and proceeds.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.render import names

from e2e.cluster.testing import Kubectl, condition, is_true, wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 90


def routed() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference-inference-pool.yaml").read_text())
    doc["spec"].update(replicas=1, networkPolicy={"enabled": True})
    doc["spec"]["resources"]["cpu"] = "250m"
    return doc


def foreign_objects(deployment: str) -> list[dict[str, Any]]:
    """What a team member with `admin` in the namespace made first, under the children's names."""
    router = names.router(deployment)
    labels = {"team": "theirs"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": names.client_service(deployment), "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "web", "port": 80}]},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": names.network_policy(deployment), "labels": labels},
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"]},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": router, "labels": labels}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": router, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": router, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router},
            "subjects": [{"kind": "ServiceAccount", "name": "default"}],
        },
    ]


def test_objects_someone_else_made_under_the_childrens_names_are_never_taken_over(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    doc = routed()
    name = doc["metadata"]["name"]
    theirs = foreign_objects(name)
    kubectl.apply(theirs, namespace=namespace)
    keys = [(o["kind"], o["metadata"]["name"]) for o in theirs]
    before = {(kind, obj_name): kubectl.get(kind, obj_name, namespace) for kind, obj_name in keys}

    kubectl.apply(doc, namespace=namespace)
    ld = wait_for(
        "Stalled NameConflict",
        lambda: kubectl.get("llmdeployment", name, namespace),
        lambda o: o is not None and is_true(o, "Stalled"),
        timeout=TIMEOUT,
    )
    assert ld is not None
    uid = ld["metadata"]["uid"]
    stalled = condition(ld, "Stalled")
    assert stalled is not None and stalled["reason"] == "NameConflict", stalled
    for kind, obj_name in before:
        assert f"{kind} {obj_name} (made by someone else)" in stalled["message"]
    assert "does not take over" in stalled["message"]
    assert not is_true(ld, "Ready")
    events = kubectl.events(namespace, name)
    assert any(e["type"] == "Warning" and e["reason"] == "NameConflict" for e in events)

    # The pass that said so wrote none of them, and made nothing of the deployment's.
    for (kind, obj_name), was in before.items():
        now = kubectl.get(kind, obj_name, namespace)
        assert now is not None and was is not None
        assert now["metadata"]["resourceVersion"] == was["metadata"]["resourceVersion"], f"{kind} was written"
        assert not now["metadata"].get("ownerReferences"), f"{kind} {obj_name} was adopted"
    assert kubectl.items("statefulsets", namespace) == []
    assert kubectl.items("deployments", namespace) == []

    # Theirs gone, the deployment makes its own (within the recheck period: foreign objects are
    # not watched) and proceeds.
    for kind, obj_name in before:
        kubectl.delete(kind, obj_name, namespace=namespace)
    wait_for(
        "the deployment's own children",
        lambda: kubectl.items("statefulsets", namespace),
        lambda items: len(items) == 1,
        timeout=TIMEOUT,
    )
    for kind, obj_name in before:
        obj = wait_for(
            f"{kind} {obj_name} made by the operator",
            functools.partial(kubectl.get, kind, obj_name, namespace),
            lambda o: o is not None,
            timeout=TIMEOUT,
        )
        assert obj is not None
        owner = obj["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("LLMDeployment", name, uid)
    ld = kubectl.get("llmdeployment", name, namespace)
    assert ld is not None and (condition(ld, "Stalled") or {}).get("reason") != "NameConflict"
