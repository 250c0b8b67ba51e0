"""What kopf itself asks of the API server, beyond the operator's own requests (controller/cluster/kube.py,
controller/cluster/lease.py). tests/unit/test_rbac.py records the operator's requests, adds these, and
compares the result with the chart's RBAC rule for rule, in both watch modes.

kopf 1.45 as the operator runs it (cli.py, controller/handlers.py): standalone (no peering
objects), one `on.event` handler (no change-detecting handlers, so no finalizer is added and no
progress annotation is written), Events posted at WARNING and above.
"""

from __future__ import annotations

from typing import NamedTuple

from llm_operator.api import v1alpha1 as api
from llm_operator.render.router.objects import ROUTER_RULES
from llm_operator.render.router.waker import WAKER_RULE


class Permission(NamedTuple):
    group: str  # "" is the core API group
    resource: str  # plural, with "/subresource" where there is one
    verb: str
    cluster_scoped: bool = False


def kopf_permissions(*, all_namespaces: bool) -> frozenset[Permission]:
    needs = {
        # kopf.on.event: the LLMDeployments it streams.
        Permission(api.GROUP, api.PLURAL, "list"),
        Permission(api.GROUP, api.PLURAL, "watch"),
        # kopf removes its finalizer from an object that carries one (an older operator's) and
        # that no handler needs: a merge PATCH of metadata, never of the spec.
        Permission(api.GROUP, api.PLURAL, "patch"),
        # Its own Events (handler failures), core/v1 only.
        Permission("", "events", "create"),
        # The resource observer watches CRDs for resources appearing and going away.
        Permission("apiextensions.k8s.io", "customresourcedefinitions", "list", cluster_scoped=True),
        Permission("apiextensions.k8s.io", "customresourcedefinitions", "watch", cluster_scoped=True),
    }
    if not all_namespaces:
        # The namespace observer lists and watches namespaces whenever it is not cluster-wide
        # (exact names included: without the permission it warns and assumes they exist).
        needs |= {
            Permission("", "namespaces", "list", cluster_scoped=True),
            Permission("", "namespaces", "watch", cluster_scoped=True),
        }
    return frozenset(needs)


def granted_permissions() -> frozenset[Permission]:
    """What the operator puts in the Roles it creates (the router's, render/router/objects.py): the API
    server refuses a Role granting more than its creator holds (RBAC escalation prevention), so
    the chart grants the operator these too."""
    return frozenset(
        Permission(group, resource, verb)
        for rule in [*ROUTER_RULES, WAKER_RULE]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )
