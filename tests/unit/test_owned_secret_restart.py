"""An operator killed between creating a deployment's Secret and recording its name in status
(controller/secrets/owned_secret.py): the e2e test that SIGKILLs the operator 20 times left two
deployments Stalled for good (AdminKeySecretNotOwned) on the operator's own Secrets."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fake_kube import FakeKube
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile


class Killed(BaseException):
    """The process ends here: nothing after it runs, nothing catches it."""


def killed_after_creating_a_secret(kube: FakeKube) -> None:
    create = kube.create

    async def create_then_die(obj: dict[str, Any]) -> bool:
        created = await create(obj)
        if obj["kind"] == "Secret":
            raise Killed
        return created

    kube.create = create_then_die  # type: ignore[method-assign]


async def test_a_restart_between_creating_the_admin_key_and_recording_it_keeps_it_as_its_own() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"tiny-llama-adminkey-{uid[:8]}"
    create = kube.create
    killed_after_creating_a_secret(kube)
    with pytest.raises(Killed):
        await reconcile(kube, reconciler, key)
    secret = kube.objects[("Secret", NS, name)]
    assert "adminKeySecret" not in kube.objects[("LLMDeployment", *key)].get("status", {})

    kube.create = create  # type: ignore[method-assign]
    _, restarted = await operator_with_nodes(kube)
    await kube.list_to(restarted)
    await reconcile(kube, restarted, key)
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["adminKeySecret"] == name
    assert "creatingSecrets" not in status, "removed with the record"
    assert condition(kube, "tiny-llama", "Stalled")["status"] == "False"
    assert kube.objects[("Secret", NS, name)] == secret, "kept, not replaced"
    assert kube.of_kind("StatefulSet"), "its pods start with it"


async def test_a_secret_someone_else_made_is_still_refused_and_none_is_left_marked_as_creating() -> None:
    kube, reconciler = await operator_with_nodes()
    key = kube.add_deployment(example("cpu-reference"))
    uid = kube.objects[("LLMDeployment", *key)]["metadata"]["uid"]
    name = f"tiny-llama-adminkey-{uid[:8]}"
    kube.objects[("Secret", NS, name)] = {"kind": "Secret", "metadata": {"name": name, "namespace": NS}}
    await reconcile(kube, reconciler, key)
    _, restarted = await operator_with_nodes(kube)
    await kube.list_to(restarted)
    await reconcile(kube, restarted, key)
    status = kube.objects[("LLMDeployment", *key)]["status"]
    assert status["reason"] == "AdminKeySecretNotOwned"
    assert "creatingSecrets" not in status and "adminKeySecret" not in status
    assert not kube.of_kind("StatefulSet")
