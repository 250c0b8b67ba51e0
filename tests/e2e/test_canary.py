"""Canary rollouts on real pods (issue 12, item 8): the real node runs both revisions, the test
world's Prometheus measures them, and bounded traffic from inside the cluster's network namespace
goes through the client Service (replica-ratio) while the operator steps, analyses, promotes or
aborts.

Needs the embedded cluster (its monitoring stack and the real node).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from llm_operator.contract import OPENAI_PORT

from e2e.cluster import canary, gateway, netns, straggler
from e2e.cluster.canary import NAME, Recorder, revisions, serving_pods
from e2e.cluster.load import Load
from e2e.cluster.testing import E2ECluster, Kubectl, condition, wait_for
from e2e.generate import connection
from e2e.gitops import argocd_health, assert_kstatus
from tests.e2e.test_operator import wait_ready

pytestmark = pytest.mark.e2e
ROLLOUT_TIMEOUT = 420
# Each of the 2 load workers starts a request at most every 0.25 s (8 requests/s in all): enough for
# every analysis interval, and the cores stay with the cluster, whose pods start during the rollout.
PACE_S = 0.25
SCALE_DOWN_DELAY_S = 10  # gateway-api: the replaced slot's pods outlive the promotion this long


def get(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    obj = kubectl.get("llmdeployment", NAME, namespace)
    assert obj is not None
    return obj


def wait_revisions(
    kubectl: Kubectl, namespace: str, what: str, ok: Any, timeout: float = ROLLOUT_TIMEOUT
) -> dict[str, Any]:
    return dict(
        wait_for(what, lambda: revisions(kubectl.get("llmdeployment", NAME, namespace)), ok, timeout=timeout)
    )


def start(kubectl: Kubectl, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The first revision applied and Ready: it is the stable one, in slot a."""
    kubectl.apply(doc, namespace=namespace)
    wait_ready(kubectl, namespace, NAME, timeout=300)
    r = revisions(get(kubectl, namespace))
    assert r["stableSlot"] == "a" and r["phase"] == "Stable" and "canary" not in r, r
    return r


def load(embedded: E2ECluster, kubectl: Kubectl, namespace: str, seconds: float) -> Load:
    service = kubectl.get("service", NAME, namespace)
    assert service is not None and embedded.launcher is not None
    return Load(
        embedded.launcher.netns, service["spec"]["clusterIP"], OPENAI_PORT, concurrency=2,
        max_requests=20_000, max_seconds=seconds, openai_model=straggler.MODEL, pace_seconds=PACE_S,
    )  # fmt: skip


def reasons(kubectl: Kubectl, namespace: str) -> list[str]:
    return [e.get("reason", "") for e in kubectl.events(namespace, NAME)]


def test_a_good_canary_goes_through_every_step_and_is_promoted_without_a_restart(
    operator: None, embedded: E2ECluster, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    v1 = canary.deployment(prometheus)
    first = start(kubectl, namespace, v1)
    with Recorder(kubectl, namespace) as rec, load(embedded, kubectl, namespace, ROLLOUT_TIMEOUT) as traffic:
        kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v2"), namespace=namespace)
        r = wait_revisions(
            kubectl, namespace, "a canary replica Ready", lambda r: (r.get("canaryReadyReplicas") or 0) >= 1
        )
        canary_pod = serving_pods(kubectl, namespace)[f"{NAME}-b-0"]
        assert r["canarySlot"] == "b" and canary_pod["revision"] == r["canary"], (r, canary_pod)
        done = wait_revisions(
            kubectl, namespace, "the canary promoted",
            lambda r: r.get("phase") == "Stable" and r.get("stable") != first["stable"],
        )  # fmt: skip
        stats = traffic.stop()
    assert stats.failed == 0, stats.errors
    assert stats.ok > 100
    assert done["stable"] == r["canary"] and done["stableSlot"] == "b", done
    assert rec.seen("canaryStep") == [0, 1], rec.seen("canaryStep")
    assert {"Progressing", "Promoting", "Stable"} <= set(rec.seen("phase")), rec.seen("phase")
    # Analysis passed on every step before it advanced.
    assert rec.first(lambda s: (s.revisions.get("analysis") or {}).get("phase") == "Running")
    pods = wait_for(
        "the old slot gone",
        lambda: serving_pods(kubectl, namespace),
        lambda p: len(p) == 2 and all(v["slot"] == "b" and not v["terminating"] for v in p.values()),
        timeout=120,
    )
    promoted = pods[f"{NAME}-b-0"]
    assert promoted["uid"] == canary_pod["uid"] and promoted["restarts"] == 0, "promotion restarted no pod"
    assert kubectl.get("statefulset", NAME, namespace) is None
    assert {"CanaryStarted", "CanaryStepCompleted", "CanaryPromoted"} <= set(reasons(kubectl, namespace))
    ld = get(kubectl, namespace)
    assert (condition(ld, "Ready") or {}).get("status") == "True", ld["status"]
    assert_kstatus(ld, "Current")
    assert argocd_health(ld)["status"] == "Healthy"


def test_b_a_bad_canary_is_aborted_within_two_intervals_and_stable_loses_nothing(
    operator: None, embedded: E2ECluster, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    v1 = canary.deployment(prometheus)
    first = start(kubectl, namespace, v1)
    stable_pods = {n: p["uid"] for n, p in serving_pods(kubectl, namespace).items()}
    with Recorder(kubectl, namespace) as rec, load(embedded, kubectl, namespace, ROLLOUT_TIMEOUT) as traffic:
        kubectl.apply(canary.with_env(v1, LLMOP_FAULT_ERROR_PERCENT="50"), namespace=namespace)
        aborted = wait_revisions(
            kubectl, namespace, "the canary aborted", lambda r: r.get("phase") == "Aborted"
        )
        wait_revisions(
            kubectl, namespace, "the canary holding no traffic",
            lambda r: r.get("canaryReadyReplicas") == 0 and r.get("canaryWeight") == 0, timeout=60,
        )  # fmt: skip
        wait_for(
            "no canary pod left",
            lambda: serving_pods(kubectl, namespace),
            lambda p: all(v["slot"] == "a" for v in p.values()),
            timeout=120,
        )
        stats = traffic.stop()
    took = rec.first(lambda s: (s.revisions.get("canaryReadyReplicas") or 0) >= 1)
    gone = rec.first(
        lambda s: s.revisions.get("phase") == "Aborted" and s.revisions.get("canaryReadyReplicas") == 0
    )
    assert took is not None and gone is not None
    intervals = (gone.t - took.t) / canary.INTERVAL_S
    print(f"bad canary: no traffic {gone.t - took.t:.1f} s after it took some ({intervals:.2f} intervals)")
    assert intervals <= 2.5, "the first window ends one interval after the canary took traffic"
    assert stats.injected > 0 and stats.not_injected == 0, stats.errors
    assert aborted["stable"] == first["stable"] and "error rate" in aborted["abortReason"], aborted
    ld = get(kubectl, namespace)
    for type_, status in (("Stalled", "True"), ("Degraded", "True"), ("Ready", "False")):
        c = condition(ld, type_)
        assert c is not None and c["status"] == status and c["reason"] == "RolloutAborted", ld["status"]
    assert "error rate" in (condition(ld, "Stalled") or {}).get("message", "")
    # What Flux / Helm 4 (kstatus) and Argo CD (the chart's health check) make of it.
    assert_kstatus(ld, "Failed", "error rate")
    assert argocd_health(ld)["status"] == "Degraded"
    # The stable pods served throughout and were never replaced (one may have been scaled away
    # and back while the canary held a share).
    after = serving_pods(kubectl, namespace)
    assert after[f"{NAME}-0"]["uid"] == stable_pods[f"{NAME}-0"]
    assert "RolloutAborted" in reasons(kubectl, namespace)


def test_d_no_traffic_is_inconclusive_and_pauses_until_promoted(
    operator: None, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    v1 = canary.deployment(prometheus)
    first = start(kubectl, namespace, v1)
    kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v2"), namespace=namespace)
    paused = wait_revisions(
        kubectl, namespace, "the canary paused (no traffic)", lambda r: r.get("phase") == "Paused"
    )
    assert paused["pausedReason"] == "Inconclusive", paused
    assert any(m.get("inconclusive", 0) >= 1 for m in paused["analysis"]["metrics"]), paused["analysis"]
    time.sleep(2 * canary.INTERVAL_S)  # paused means paused: no step, no promotion
    held = revisions(get(kubectl, namespace))
    assert held["phase"] == "Paused" and held["canaryStep"] == 0 and held["stable"] == first["stable"], held
    ld = get(kubectl, namespace)
    assert_kstatus(ld, "InProgress")
    assert argocd_health(ld)["status"] == "Suspended"
    action = f"promote-full/{int(time.time())}"
    kubectl(
        "annotate",
        "llmdeployment",
        NAME,
        f"llmoperator.io/rollout-action={action}",
        "--overwrite",
        "-n",
        namespace,
    )
    done = wait_revisions(
        kubectl,
        namespace,
        "promoted by the user",
        lambda r: r.get("phase") == "Stable" and r.get("stable") == paused["canary"],
    )
    assert done["lastAction"] == action


def test_e_a_new_spec_mid_canary_restarts_it_and_the_stable_spec_rolls_back_at_once(
    operator: None, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    v1 = canary.without_analysis(canary.deployment(prometheus, steps=[{"weight": 50}]))
    first = start(kubectl, namespace, v1)
    stable_pods = {n: p["uid"] for n, p in serving_pods(kubectl, namespace).items()}
    kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v2"), namespace=namespace)
    v2 = wait_revisions(
        kubectl, namespace, "v2 paused at its step", lambda r: r.get("pausedReason") == "UntilPromoted"
    )
    kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v3"), namespace=namespace)
    v3 = wait_revisions(
        kubectl, namespace, "v3 replacing v2 at step 0",
        lambda r: r.get("canary") not in (None, v2["canary"]) and r.get("pausedReason") == "UntilPromoted",
    )  # fmt: skip
    assert v3["canarySlot"] == v2["canarySlot"] == "b" and v3["canaryStep"] == 0, v3
    pods = wait_for(
        "the canary pod running v3",
        lambda: serving_pods(kubectl, namespace),
        lambda p: p.get(f"{NAME}-b-0", {}).get("revision") == v3["canary"],
        timeout=180,
    )
    assert pods[f"{NAME}-b-0"]["revision"] == v3["canary"]
    started = time.monotonic()
    kubectl.apply(v1, namespace=namespace)  # what is stable: roll back at once, no steps
    back = wait_revisions(kubectl, namespace, "rolled back", lambda r: "canary" not in r, timeout=30)
    assert time.monotonic() - started < 15
    assert back["stable"] == first["stable"] and back["phase"] == "Stable", back
    wait_for(
        "the canary slot gone",
        lambda: serving_pods(kubectl, namespace),
        lambda p: all(v["slot"] == "a" for v in p.values()),
        timeout=120,
    )
    # The first stable pod served throughout (the second made room for the canary's Ready replica
    # and came back with the rollback).
    after = serving_pods(kubectl, namespace)
    assert after[f"{NAME}-0"]["uid"] == stable_pods[f"{NAME}-0"] and after[f"{NAME}-0"]["restarts"] == 0
    assert {"CanaryRestarted", "CanaryRolledBack"} <= set(reasons(kubectl, namespace))


def epoch_seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_c_gateway_api_routes_by_weight_through_a_real_gateway_and_promotes(
    operator: None, embedded: E2ECluster, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    """The same good canary with trafficRouting gateway-api: traffic enters through the test
    world's Gateway (Traefik), the operator's HTTPRoute splits it by weight between the revision
    Services, and the canary gets weight only once its Service has ready endpoints. After the
    promotion the replaced slot keeps its pods for scaleDownDelaySeconds, while the gateway loads
    the new route; not one request fails from the first step to the old pods' removal."""
    assert embedded.launcher is not None
    refs = [{"name": gateway.GATEWAY, "namespace": gateway.NAMESPACE, "sectionName": gateway.LISTENER}]
    v1 = canary.deployment(prometheus, routing="gateway-api", parent_refs=refs)
    v1["spec"]["rollout"]["canary"]["scaleDownDelaySeconds"] = SCALE_DOWN_DELAY_S
    first = start(kubectl, namespace, v1)
    route = wait_for(
        "the HTTPRoute accepted by the Gateway",
        lambda: kubectl.get("httproute", NAME, namespace),
        lambda r: any(
            c["type"] == "Accepted" and c["status"] == "True"
            for p in (r or {}).get("status", {}).get("parents", [])
            for c in p.get("conditions", [])
        ),
        timeout=60,
    )
    assert [b["name"] for b in (route or {})["spec"]["rules"][0]["backendRefs"]] == [f"{NAME}-stable"]
    # The route's /v1 rule: the OpenAI API through the same Gateway (Traefik loads a route within 2 s).
    names = ["llm-operator/tiny-llama", "tiny-llama"]
    wait_for("/v1/models through the Gateway", lambda: served_names(embedded.launcher), lambda n: n == names)
    traffic = Load(
        embedded.launcher.netns, netns.NODE_IP, gateway.PORT, concurrency=2, max_requests=20_000,
        max_seconds=ROLLOUT_TIMEOUT, openai_model=straggler.MODEL, pace_seconds=PACE_S,
    )  # fmt: skip
    # (seconds into the rollout, phase, route weights, slots with pods): what a failure is read against
    seen: list[tuple[float, str, dict[str, int], list[str]]] = []
    promoted: dict[str, Any] = {}
    with traffic:
        kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v2"), namespace=namespace)
        began = time.monotonic()
        while time.monotonic() < began + ROLLOUT_TIMEOUT:
            r = revisions(get(kubectl, namespace))
            live = kubectl.get("httproute", NAME, namespace) or {}
            backends = (live.get("spec", {}).get("rules") or [{}])[0].get("backendRefs", [])
            slots = sorted(
                {p["slot"] for p in serving_pods(kubectl, namespace).values() if not p["terminating"]}
            )
            seen.append(
                (
                    time.monotonic() - began,
                    r.get("phase", ""),
                    {b["name"]: b.get("weight", 1) for b in backends},
                    slots,
                )
            )
            if r.get("phase") == "Stable" and r.get("stable") != first["stable"]:
                promoted = promoted or {**r, "slots": slots}
                if slots == [r["stableSlot"]]:
                    break
            time.sleep(1)
        stats = traffic.stop()
    failures = [round(t - began, 1) for t in stats.failed_at]
    assert stats.failed == 0 and stats.ok > 100, (failures, stats.errors[:3], seen)
    done = revisions(get(kubectl, namespace))
    assert done.get("phase") == "Stable" and done.get("stable") != first["stable"], done
    # Right after the promotion the replaced slot still ran, until the time status gave for it.
    assert promoted.get("scaleDownAt") and promoted["slots"] == ["a", "b"], promoted
    assert "scaleDownAt" not in done and serving_pods(kubectl, namespace), done
    canary_weights = [w.get(f"{NAME}-canary", 0) for _, _, w, _ in seen]
    assert any(0 < w < 100 for w in canary_weights), seen  # a share, then all of it
    assert 100 in canary_weights or done["stableSlot"] == "b", seen


def served_names(launcher: Any) -> list[str]:
    """GET /v1/models through the Gateway's listener, from inside the cluster's network."""
    conn = connection(netns.NODE_IP, gateway.PORT, inside=launcher.netns, timeout=30)
    try:
        conn.request("GET", "/v1/models")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, body[:300]
    return [m["id"] for m in json.loads(body)["data"]]


def test_c_a_route_the_gateway_refuses_stalls_the_deployment_in_its_words(
    operator: None, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    refs = [{"name": gateway.GATEWAY, "namespace": gateway.NAMESPACE, "sectionName": "no-such-listener"}]
    kubectl.apply(canary.deployment(prometheus, routing="gateway-api", parent_refs=refs), namespace=namespace)
    ld = wait_for(
        "Stalled: the route is not accepted",
        lambda: kubectl.get("llmdeployment", NAME, namespace),
        lambda o: (condition(o, "Stalled") or {}).get("reason") == "RouteNotAccepted",
        timeout=180,
    )
    message = (condition(ld, "Stalled") or {}).get("message", "")
    assert "no-such-listener" in message and "NoMatchingParent" in message, message


def test_g_through_the_picker_an_aborted_canary_gets_no_request_and_a_good_one_is_promoted(
    operator: None, embedded: E2ECluster, prometheus: str, kubectl: Kubectl, namespace: str
) -> None:
    """replica-ratio with spec.routing.mode inference-pool: the pool selects the leaders of every
    live revision, so the canary's weight is its share of the leaders the picker chooses from.
    Traffic (OpenAI completions) goes through the router all along: a bad canary takes some, is
    aborted, and no request reaches it once its weight is 0; then a good one takes its share (its
    pod's own Triton counter) and is promoted, with not one request failed by anything but the
    fault knob."""
    assert embedded.launcher is not None
    v1 = canary.deployment(prometheus, steps=[{"weight": 50, "pauseSeconds": 5}])
    v1["spec"]["routing"] = {"mode": "inference-pool"}
    first = start(kubectl, namespace, v1)
    ip = straggler.cluster_ip(kubectl, namespace, straggler.router(NAME))
    traffic = Load(
        embedded.launcher.netns, ip, OPENAI_PORT, concurrency=2, max_requests=20_000,
        max_seconds=ROLLOUT_TIMEOUT, openai_model=straggler.MODEL, pace_seconds=PACE_S,
    )  # fmt: skip
    with Recorder(kubectl, namespace) as rec, traffic:
        kubectl.apply(canary.with_env(v1, LLMOP_FAULT_ERROR_PERCENT="50"), namespace=namespace)
        aborted = wait_revisions(
            kubectl, namespace, "the bad canary withdrawn",
            lambda r: r.get("phase") == "Aborted" and r.get("canaryReadyReplicas") == 0
            and r.get("canaryWeight") == 0,
        )  # fmt: skip
        withdrawn = time.monotonic()
        kubectl.apply(canary.with_env(v1, RELEASE_NOTE="v3"), namespace=namespace)
        old = (first["stable"], aborted.get("canary"))
        done = wait_revisions(
            kubectl, namespace, "the good canary promoted",
            lambda r: r.get("phase") == "Stable" and r.get("stable") not in old,
        )  # fmt: skip
        stats = traffic.stop()
    assert stats.injected > 0, "the bad canary took traffic through the router"
    assert stats.not_injected == 0, stats.errors
    # Requests in flight at the moment may end a little later; none started after it failed.
    late = [round(t - withdrawn, 1) for t in stats.failed_at if t > withdrawn + 2]
    assert not late, f"requests failed by the aborted revision after its weight went to 0: {late}"
    assert rec.first(lambda s: s.revisions.get("phase") == "Aborted") is not None
    promoted = {n: p for n, p in serving_pods(kubectl, namespace).items() if p["revision"] == done["stable"]}
    ips = {n: ip for n, ip in straggler.pod_ips(kubectl, namespace).items() if n in promoted}
    served = straggler.counts(embedded.launcher.netns, ips)
    print(f"through the picker: {stats.ok} ok, {stats.injected} failed by the bad canary; "
          f"served by the promoted revision's pods: {served}")  # fmt: skip
    assert any(served.values()), "the picker sent the good canary its share"
