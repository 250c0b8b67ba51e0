"""The scale-to-zero hold without holdSeconds follows the measured cold start (render/scale_to_zero.py):
the derivation, when a derived hold changes (only at zero replicas, a change restarts the router, and
only upwards: a fast start on one node must not cut the hold below a slow one on another), what the
router's picker and Envoy are rendered with, HoldCoversColdStart (controller/status/hold_status.py),
and the whole path through the reconciler."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from llm_operator import labels as L
from llm_operator.api.v1alpha1 import LLMDeployment, ScaleToZeroSpec
from llm_operator.controller.status import hold_status
from llm_operator.controller.status.cold_start import ColdStart
from llm_operator.controller.status.status import Observation, reduce
from llm_operator.images import Images
from llm_operator.plan.cpu import cpu_plan
from llm_operator.render.router.objects import limits_for, router_config, router_deployment
from llm_operator.render.scale_to_zero import derived_hold, hold_seconds, running_hold

from tests.unit.test_cold_start import pod
from tests.unit.test_reconciler import NS, condition, example, operator_with_nodes, reconcile

NAME = "tiny-llama-zero"
ROUTER = f"{NAME}-router"
IMAGES = Images("runtime", "cpu-runtime", "", "1.1.0", waker="op:1")


@pytest.mark.parametrize(
    ("cold_start_s", "hold_s"),
    [
        (None, 300),  # nothing measured: the default of earlier versions
        (30, 300),  # a CPU start: the default covers it ten times
        (200, 300),  # 1.5 x 200 = 300: the default, exactly
        (201, 360),  # 301.5 s, rounded up to the minute
        (240, 360),
        (400, 600),
        (420, 660),
        (560, 840),
        (561, 900),
        (700, 900),  # 1,050 s: the ceiling (ext_proc's message_timeout bounds it)
        (1200, 900),
    ],
)
def test_the_derived_hold_is_one_and_a_half_cold_starts_in_whole_minutes_from_300_to_900_s(
    cold_start_s: int | None, hold_s: int
) -> None:
    assert derived_hold(cold_start_s) == hold_s


DERIVED, SET = ScaleToZeroSpec(), ScaleToZeroSpec(hold_seconds=120)


@pytest.mark.parametrize(
    ("zero", "cold_start_s", "running", "at_zero", "hold_s"),
    [
        (SET, 400, None, False, 120),  # set: as is, whatever the cold start
        (SET, 400, 600, True, 120),
        (DERIVED, 400, None, False, 600),  # no router yet (or a hold set before): derived at once
        (DERIVED, 400, 300, False, 300),  # serving: the router keeps what it runs
        (DERIVED, 400, 300, True, 600),  # at zero: raised to what the cold start needs
        (DERIVED, 400, 660, True, 660),  # a faster start than the one the router's hold came from:
        (DERIVED, 400, 720, True, 720),  # kept, at zero too (the next start may be on a slower node)
        (DERIVED, 30, 900, False, 900),
        (DERIVED, 30, 900, True, 900),
        (DERIVED, None, 600, True, 600),
    ],
)
def test_a_set_hold_is_used_as_is_and_a_derived_one_the_router_runs_is_only_raised_at_zero(
    zero: ScaleToZeroSpec, cold_start_s: int | None, running: int | None, at_zero: bool, hold_s: int
) -> None:
    assert hold_seconds(zero, cold_start_s, running, at_zero) == hold_s


def deployment(
    *, hold_s: int | None = None, cold_start_s: int | None = None, replicas: int = 1
) -> LLMDeployment:
    body = copy.deepcopy(example("cpu-reference-scale-to-zero"))
    body["metadata"]["namespace"] = NS
    body["spec"]["replicas"] = replicas
    zero = body["spec"]["autoscaling"]["scaleToZero"]
    if hold_s is None:
        del zero["holdSeconds"]
    else:
        zero["holdSeconds"] = hold_s
    if cold_start_s is not None:
        body["status"] = {"lastColdStart": cold(cold_start_s).fields()}
    return LLMDeployment.model_validate(body)


def cold(total_s: int) -> ColdStart:
    at = "2026-11-29T10:00:00Z"
    return ColdStart("u0", f"{NAME}-0", 1, at, at, (("scheduled", 0), ("initialized", 0), ("started", 0),
                                                    ("ready", total_s)))  # fmt: skip


def config_of(ld: LLMDeployment, running: int | None = None) -> dict[str, Any]:
    return router_config(ld, limits_for(ld, running))


def rendered(config: dict[str, Any]) -> tuple[str, str, str, str | None]:
    """(the picker's TTL, the picking listener's request timeout, its 503's words, the record)."""
    epp, envoy = yaml.safe_load(config["data"]["epp.yaml"]), yaml.safe_load(config["data"]["envoy.yaml"])
    listener = next(x for x in envoy["static_resources"]["listeners"] if x["name"] == "picking")
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    mappers = manager["local_reply_config"]["mappers"]
    refusal = next(
        m for m in mappers if m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 503
    )
    words = refusal["body_format_override"]["json_format"]["error"]["message"]
    record = (config["metadata"].get("annotations") or {}).get(L.DERIVED_HOLD)
    return epp["flowControl"]["defaultRequestTTL"], manager["request_timeout"], words, record


def test_the_router_holds_for_the_set_hold_or_the_one_derived_from_status_last_cold_start() -> None:
    # Envoy's picking listener allows its 300 s for the request plus the hold; its 503 names the hold.
    assert rendered(config_of(deployment())) == ("300s", "600s", rendered_words(300), "300")
    measured = config_of(deployment(cold_start_s=400))
    assert rendered(measured) == ("600s", "900s", rendered_words(600), "600")
    assert rendered(config_of(deployment(hold_s=120, cold_start_s=400))) == (
        "120s", "420s", rendered_words(120), None,
    )  # fmt: skip
    # A derived hold the router runs stays while it serves, and is raised at zero replicas, never lowered.
    assert rendered(config_of(deployment(cold_start_s=400), 300))[0] == "300s"
    assert rendered(config_of(deployment(cold_start_s=400, replicas=0), 300))[0] == "600s"
    assert rendered(config_of(deployment(cold_start_s=30, replicas=0), 600)) == (
        "600s", "900s", rendered_words(600), "600",
    )  # fmt: skip


def rendered_words(hold_s: int) -> str:
    return (
        f"no replica could take the request within the router's hold of {hold_s} s "
        "(autoscaling.scaleToZero.holdSeconds; at zero replicas the first one was still starting): "
        "%LOCAL_REPLY_BODY%"
    )


def test_only_a_changed_hold_restarts_the_router() -> None:
    """The router reads its files at start (its pod template carries their hash): a new cold start
    leaves it running until the hold it gets changes."""

    def template_hash(ld: LLMDeployment, running: int | None) -> str:
        limits = limits_for(ld, running)
        deployment = router_deployment(ld, IMAGES, router_config(ld, limits), limits)
        return str(deployment["spec"]["template"]["metadata"]["annotations"][L.TEMPLATE_HASH])

    before = template_hash(deployment(), None)
    assert template_hash(deployment(cold_start_s=400), 300) == before, "serving: no restart"
    assert template_hash(deployment(cold_start_s=400, replicas=0), 300) != before, "at zero: the new hold"
    assert template_hash(deployment(cold_start_s=30, replicas=0), 300) == before
    assert template_hash(deployment(cold_start_s=30, replicas=0), 600) == template_hash(
        deployment(cold_start_s=400, replicas=0), 300
    ), "a faster start at zero: the router keeps its hold, and runs on"


def test_the_running_hold_is_read_from_the_applied_configmaps_record_and_nothing_else() -> None:
    def applied(annotations: dict[str, str] | None) -> dict[str, Any]:
        return {
            "kind": "ConfigMap",
            "metadata": {"name": ROUTER, **({"annotations": annotations} if annotations else {})},
        }

    assert running_hold(applied({L.DERIVED_HOLD: "600"})) == 600
    assert running_hold(config_of(deployment(cold_start_s=400))) == 600
    assert running_hold(config_of(deployment(hold_s=120))) is None, "a hold set in the spec is no record"
    for value in ("", "abc", "-300", "120", "901"):  # not a hold the operator derives
        assert running_hold(applied({L.DERIVED_HOLD: value})) is None, value
    assert running_hold(applied(None)) is None and running_hold(None) is None


def condition_of(ld: LLMDeployment, *starts: ColdStart, old: dict[str, Any] | None = None,
                running: int | None = None) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:  # fmt: skip
    obs = Observation(1, cpu_plan(ld.spec), cold_starts=starts, hold=hold_status.observe(ld, {
        "metadata": {"annotations": {L.DERIVED_HOLD: str(running)}} if running else {}
    }))  # fmt: skip
    status, events = reduce(obs, old, "2026-11-29T10:30:00Z")
    found = next(c for c in status["conditions"] if c["type"] == hold_status.CONDITION)
    reasons = (hold_status.NOT_MEASURED, hold_status.DERIVED, hold_status.SET, hold_status.BELOW,
               hold_status.ABOVE_MAX)  # fmt: skip
    return found, [(e.type, e.reason, e.message) for e in events if e.reason in reasons]


def test_the_condition_says_whether_the_hold_covers_the_last_cold_start_and_warns_when_not() -> None:
    c, events = condition_of(deployment())
    assert (c["status"], c["reason"]) == ("Unknown", "ColdStartNotMeasured") and not events
    assert c["message"] == "the router holds a request up to 300 s (no cold start yet)"

    c, events = condition_of(deployment(), cold(400), running=300)
    assert (c["status"], c["reason"]) == ("True", "HoldDerived") and not events
    assert c["message"] == (
        f"the last cold start (pod {NAME}-0) took 400 s: the router holds a request at zero replicas up "
        "to 600 s, derived from it (it holds 300 s until the deployment is next at zero replicas)"
    )

    c, events = condition_of(deployment(), cold(30), running=900)
    assert (c["status"], c["reason"]) == ("True", "HoldDerived") and not events
    assert c["message"] == (
        f"the last cold start (pod {NAME}-0) took 30 s: the router holds a request at zero replicas up "
        "to 900 s, derived from a slower cold start before it (set autoscaling.scaleToZero.holdSeconds "
        "for a shorter hold than that)"
    )

    c, events = condition_of(deployment(hold_s=120), cold(400))
    assert (c["status"], c["reason"]) == ("False", "HoldBelowColdStart")
    said = (
        f"autoscaling.scaleToZero.holdSeconds is 120 s, and the last cold start (pod {NAME}-0) took 400 s: "
        "a request that arrives at zero replicas gets a 503 before a replica is Ready; remove "
        "autoscaling.scaleToZero.holdSeconds to have it derived from the cold start (600 s), or set it "
        "to that or more"
    )
    assert c["message"] == said and events == [("Warning", "HoldBelowColdStart", said)]
    old = {"conditions": [c]}
    _, events = condition_of(deployment(hold_s=120), cold(420), old=old)
    assert not events, "posted once, not at each new cold start"

    for ld in (deployment(), deployment(hold_s=900)):  # not even the ceiling covers it
        c, events = condition_of(ld, cold(950), old=old)
        assert (c["status"], c["reason"]) == ("False", "ColdStartAboveMaxHold"), c
        assert "took 950 s" in c["message"] and "at most 900 s" in c["message"], c
        assert "set autoscaling.minReplicas 1" in c["message"], c
        assert events == [("Warning", "ColdStartAboveMaxHold", c["message"])], "a new reason is news"

    c, _ = condition_of(deployment(hold_s=500), cold(400))
    assert (c["status"], c["reason"]) == ("True", "HoldSet"), c


def test_without_scale_to_zero_there_is_no_hold_condition() -> None:
    body = copy.deepcopy(example("cpu-reference-keda"))
    ld = LLMDeployment.model_validate(body)
    assert hold_status.observe(ld, None) is None


async def test_a_measured_cold_start_raises_the_routers_hold_at_zero_a_faster_one_keeps_it() -> None:
    kube, reconciler = await operator_with_nodes()
    body = example("cpu-reference-scale-to-zero")
    del body["spec"]["autoscaling"]["scaleToZero"]["holdSeconds"]
    key = kube.add_deployment(body)
    await reconcile(kube, reconciler, key)

    def router() -> tuple[str, str | None, str]:
        config = kube.objects[("ConfigMap", NS, ROUTER)]
        ttl = yaml.safe_load(config["data"]["epp.yaml"])["flowControl"]["defaultRequestTTL"]
        template = kube.objects[("Deployment", NS, ROUTER)]["spec"]["template"]["metadata"]
        return (
            ttl,
            config["metadata"]["annotations"].get(L.DERIVED_HOLD),
            template["annotations"][L.TEMPLATE_HASH],
        )

    ttl, record, first = router()
    assert (ttl, record) == ("300s", "300")
    assert condition(kube, NAME, hold_status.CONDITION)["status"] == "Unknown"

    # A replica that took 400 s (a GPU image pulled, weights loaded): the hold it needs is 600 s,
    # but the router carries the replica's traffic, so it is not restarted for it.
    async def cold_start(uid: str, created: int, started: int, ready: int) -> None:
        new = pod(f"{NAME}-0", uid=uid, created=created, scheduled=created + 1, init_end=created + 2,
                  started=started, ready=ready, labels={L.DEPLOYMENT: NAME})  # fmt: skip
        await reconciler.pod_event("ADDED", {**new, "status": {"phase": "Pending"}})
        await reconciler.pod_event("MODIFIED", new)
        await reconcile(kube, reconciler, key)

    await cold_start("z0", created=0, started=300, ready=400)
    assert kube.objects[("LLMDeployment", *key)]["status"]["lastColdStart"]["totalSeconds"] == 400
    await reconcile(kube, reconciler, key)  # a later pass renders from the status written
    assert router() == ("300s", "300", first), "the router runs on"
    cond = condition(kube, NAME, hold_status.CONDITION)
    assert (cond["status"], cond["reason"]) == ("True", "HoldDerived")
    assert "up to 600 s" in cond["message"] and "holds 300 s until" in cond["message"], cond

    # KEDA idles it to zero: nothing is held or in flight, the router restarts with the new hold.
    kube.edit("LLMDeployment", *key, spec={**kube.objects[("LLMDeployment", *key)]["spec"], "replicas": 0})
    await reconcile(kube, reconciler, key)
    ttl, record, restarted = router()
    assert (ttl, record) == ("600s", "600") and restarted != first
    assert "until" not in condition(kube, NAME, hold_status.CONDITION)["message"]

    # Woken again, a replica on a node with the image cached starts in 30 s: back at zero, the
    # router keeps its 600 s (the next start may be on a node without it), and is not restarted.
    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    kube.edit("LLMDeployment", *key, spec={**spec, "replicas": 1})
    await cold_start("z1", created=1000, started=1010, ready=1030)
    assert kube.objects[("LLMDeployment", *key)]["status"]["lastColdStart"]["totalSeconds"] == 30
    kube.edit("LLMDeployment", *key, spec={**spec, "replicas": 0})
    await reconcile(kube, reconciler, key)
    await reconcile(kube, reconciler, key)
    assert router() == ("600s", "600", restarted), "at zero, a faster start lowers nothing"
    assert "a slower cold start before it" in condition(kube, NAME, hold_status.CONDITION)["message"]

    # A hold set below the cold start: used as is, and the status and a Warning say what to change.
    spec = copy.deepcopy(kube.objects[("LLMDeployment", *key)]["spec"])
    spec["autoscaling"]["scaleToZero"]["holdSeconds"] = 20
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    assert router()[:2] == ("20s", None), "the applied ConfigMap no longer carries the record"
    cond = condition(kube, NAME, hold_status.CONDITION)
    assert (cond["status"], cond["reason"]) == ("False", "HoldBelowColdStart")
    assert ("Warning", "HoldBelowColdStart", cond["message"]) in kube.events

    # Removed again: with no record to keep, the hold is derived from the last start alone.
    del spec["autoscaling"]["scaleToZero"]["holdSeconds"]
    kube.edit("LLMDeployment", *key, spec=spec)
    await reconcile(kube, reconciler, key)
    assert router()[:2] == ("300s", "300")
