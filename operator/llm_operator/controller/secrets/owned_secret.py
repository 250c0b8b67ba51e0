"""A Secret the operator makes once per LLMDeployment and never reads: the multi-node launch identity
(controller/secrets/launch.py) and the key of Triton's admin APIs (controller/secrets/admin_key.py).

The operator may create Secrets but never read one (docs/helm.md), so whose a Secret is is learnt
from the create itself: when it succeeds, the operator records the name in a status field only it
writes. AlreadyExists for a name recorded there means an earlier run made it; for any other,
someone else did, and the deployment is refused (Stalled) rather than given a key it cannot vouch
for. Remembered, so a steady reconcile sends nothing; after a restart, one create per deployment.

The name is also written to status.creatingSecrets before the create and removed with the record:
an operator killed between its create and the record (seen in the e2e test that SIGKILLs it 20
times: the deployment Stalled for good on its own Secret) finds the name there and takes the
Secret as its own. The cost: a Secret someone else creates in that moment, the operator killed
in it, would be taken too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.plan.types import PlanningError
from llm_operator.render.children import owner_reference

CREATING = "creatingSecrets"  # status: {status field: the name being created}


def secret_of(
    ld: LLMDeployment, name: str, component: str, data: dict[str, str], type_: str = "Opaque"
) -> dict[str, Any]:
    """A Secret of `ld`'s, owned by it (the garbage collector removes it with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": ld.namespace,
            "labels": L.common_labels(ld.name, component),
            "ownerReferences": [owner_reference(ld)],
        },
        "type": type_,
        "stringData": data,
    }


class OwnedSecret:
    def __init__(
        self,
        kube: KubeApi,
        build: Callable[[LLMDeployment], dict[str, Any]],
        status_field: str,
        refusal: Callable[[str], PlanningError],
    ) -> None:
        self.kube = kube
        self.build = build
        self.status_field = status_field  # camelCase, in the LLMDeployment's status
        self.refusal = refusal  # the Secret's name -> why the deployment is Stalled
        self._ensured: set[tuple[str, str]] = set()
        self._owned: set[tuple[str, str]] = set()  # (namespace, Secret name) made or vouched for

    async def ensure(self, ld: LLMDeployment) -> dict[str, str]:
        """The status it wrote ({} if none), so the reconcile's body stays as the server has it.
        Raises the refusal's PlanningError for a Secret under the name that the operator did not
        create: nothing may use it."""
        key = (ld.namespace, ld.name)
        if key in self._ensured:
            return {}
        written: dict[str, str] = {}
        secret = self.build(ld)
        name = secret["metadata"]["name"]
        status = ld.status.model_dump(by_alias=True) if ld.status is not None else {}
        reserved = status.get(CREATING) or {}
        creating = reserved.get(self.status_field) == name
        if status.get(self.status_field) == name or creating:
            self._owned.add((ld.namespace, name))
        elif (ld.namespace, name) not in self._owned:
            creating = True
            await self.kube.patch_status(ld.namespace, ld.name, {CREATING: {self.status_field: name}})
        created = await self.kube.create(secret)
        others = set(reserved) - {self.status_field}  # an empty map is no record: none left
        done: dict[str, Any] = {CREATING: {self.status_field: None} if others else None} if creating else {}
        if created or (creating and (ld.namespace, name) in self._owned):
            written = {self.status_field: name}
            await self.kube.patch_status(ld.namespace, ld.name, {**written, **done})
            self._owned.add((ld.namespace, name))
        elif (ld.namespace, name) not in self._owned:
            if done:
                await self.kube.patch_status(ld.namespace, ld.name, done)
            raise self.refusal(name)
        self._ensured.add(key)
        return written

    def forget(self, key: tuple[str, str]) -> None:
        """Create again on the next reconcile (the deployment is gone, or its pods failed: a
        deleted Secret is one reason they do)."""
        self._ensured.discard(key)
