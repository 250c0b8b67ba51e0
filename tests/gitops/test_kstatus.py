"""kstatus (Flux health checks, Helm 4 --wait, kpt) of an LLMDeployment in every phase, computed
by cli-utils' own status.Compute (e2e/cluster/tools/kstatus) on the status the operator writes."""

from __future__ import annotations

import pytest

from e2e.gitops import assert_kstatus, kstatus
from tests.gitops.cases import CREATED, cases, llmd

CASES = cases()


def _condition(case_name: str, kind: str) -> dict[str, str]:
    return next(c for c in CASES[case_name].obj["status"]["conditions"] if c["type"] == kind)


@pytest.mark.parametrize("name", CASES)
def test_kstatus_of_every_phase(name: str) -> None:
    case = CASES[name]
    status, message = kstatus(case.obj)
    assert status == case.kstatus, f"{name}: {message}"
    # What Flux prints is the condition a person reads: the Stalled or Reconciling message.
    if status == "Failed":
        assert message == _condition(name, "Stalled")["message"] != ""
    if (
        status == "InProgress"
        and case.obj["status"]["observedGeneration"] == case.obj["metadata"]["generation"]
    ):
        assert message == _condition(name, "Reconciling")["message"] != ""


def test_every_kstatus_a_deployment_can_have_is_covered() -> None:
    assert {c.kstatus for c in CASES.values()} == {"Current", "InProgress", "Failed", "Terminating"}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "conditions" in c.obj.get("status", {})])
def test_reconciling_and_stalled_are_never_both_true(name: str) -> None:
    # kstatus takes whichever comes first in the list: both True would make the order decide.
    true = {c["type"] for c in CASES[name].obj["status"]["conditions"] if c["status"] == "True"}
    assert not {"Reconciling", "Stalled"} <= true


def test_generation_not_yet_observed_is_in_progress_whatever_the_old_status_says() -> None:
    status, message = kstatus(CASES["stalled_generation_behind"].obj)
    assert (status, message) == (
        "InProgress",
        "LLMDeployment generation is 4, but latest observed generation is 3",
    )


def test_assert_kstatus_fails_with_what_it_saw() -> None:
    assert_kstatus(CASES["canary_aborted"].obj, "Failed", "p99 TTFT 1,840 ms")
    with pytest.raises(
        AssertionError, match=r"kstatus of LLMDeployment llama is Current .*expected InProgress"
    ):
        assert_kstatus(CASES["ready"].obj, "InProgress")
    with pytest.raises(AssertionError, match="expected it to contain 'TTFT'"):
        assert_kstatus(CASES["planning_error"].obj, "Failed", "TTFT")
    with pytest.raises(AssertionError, match="does not exist"):
        assert_kstatus(None, "Current")


def test_a_new_object_reads_in_progress_thanks_to_the_crds_default_status() -> None:
    # kstatus's rule for an object without conditions is Current: without the CRD's default
    # status a new LLMDeployment would read as ready to Flux and Helm 4 until the operator writes.
    assert kstatus(llmd(None)) == ("Current", "Resource is current")
    assert kstatus(llmd(CREATED)) == (
        "InProgress",
        "LLMDeployment generation is 3, but latest observed generation is 0",
    )
