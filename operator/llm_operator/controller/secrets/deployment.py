"""Every Secret one LLMDeployment needs, each made once and never read (owned_secret.py): the admin
key always, the launch identity of multi-node groups, the picker's certificate for inference-pool
routing."""

from __future__ import annotations

from collections.abc import Sequence

from llm_operator.api.v1alpha1 import LLMDeployment, RoutingMode
from llm_operator.controller.cluster.kube import KubeApi
from llm_operator.controller.secrets.admin_key import AdminKeys
from llm_operator.controller.secrets.launch import LaunchIdentities, needs_launch_identity
from llm_operator.controller.secrets.owned_secret import OwnedSecret
from llm_operator.controller.secrets.picker_tls import PickerTls
from llm_operator.plan.types import Plan


class DeploymentSecrets:
    def __init__(self, kube: KubeApi) -> None:
        self.launch = LaunchIdentities(kube)
        self.admin_keys = AdminKeys(kube)
        self.picker_tls = PickerTls(kube)

    def needed(self, ld: LLMDeployment, plans: Sequence[Plan]) -> list[OwnedSecret]:
        """The Secrets `ld` needs with these plans (both slots of a canary)."""
        return [
            self.admin_keys,
            *([self.launch] if any(needs_launch_identity(plan) for plan in plans) else []),
            *([self.picker_tls] if ld.spec.routing.mode == RoutingMode.INFERENCE_POOL else []),
        ]

    async def ensure(self, ld: LLMDeployment, plans: Sequence[Plan]) -> dict[str, str]:
        """The status fields written (their names: proof of whose each Secret is). Raises the
        PlanningError of a Secret under its name that the operator did not create."""
        written: dict[str, str] = {}
        for secret in self.needed(ld, plans):
            written |= await secret.ensure(ld)
        return written

    def forget(self, key: tuple[str, str]) -> None:
        """Create each again on the next reconcile (the deployment is gone)."""
        for secret in (self.launch, self.admin_keys, self.picker_tls):
            secret.forget(key)
