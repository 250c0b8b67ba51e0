"""What the rollout tells the user, in Events and status.revisions.message."""

from __future__ import annotations

from datetime import timedelta

from llm_operator.api.v1alpha1 import (
    AnalysisPhase,
    CanarySpec,
    PausedReason,
    RevisionsStatus,
    RolloutPhase,
    Slot,
)
from llm_operator.rollout import timers
from llm_operator.rollout.actions import Action, one_liner

# Which phase an Event about a round of measurements takes its reason from (the worst).
SEVERITY = {
    AnalysisPhase.PENDING: 0,
    AnalysisPhase.RUNNING: 0,
    AnalysisPhase.SUCCESSFUL: 1,
    AnalysisPhase.INCONCLUSIVE: 2,
    AnalysisPhase.ERROR: 3,
    AnalysisPhase.FAILED: 4,
}


def step(s: RevisionsStatus, steps: list[int]) -> str:
    index = s.canary_step or 0
    return f"step {index + 1} of {len(steps)} ({steps[index]}%)"


def started(revision: str, slot: Slot, stable: str | None, steps: list[int]) -> str:
    return (
        f"canary {revision} started in slot {slot} beside stable {stable}: "
        f"{len(steps)} steps, {', '.join(f'{w}%' for w in steps)}"
    )


def restarted(revision: str, previous: str, slot: Slot | None) -> str:
    return (
        f"the spec changed during the canary: {revision} replaces canary {previous} in slot {slot}, "
        "from step 1"
    )


def rolled_back(stable: str | None, canary: str) -> str:
    return f"the spec is back to the stable revision {stable}: canary {canary} removed at once"


def cancelled(canary: str, revision: str) -> str:
    return f"rollout.strategy is rolling: canary {canary} removed, {revision} rolls out to every replica"


def retried(canary: str, value: str) -> str:
    return f"canary {canary} starts again from step 1 ({value})"


def unknown_action(value: str) -> str:
    return (
        f"rollout-action {value!r} is not an action: use promote, promote-full, abort or retry, "
        f"optionally followed by /TOKEN ({one_liner(Action.PROMOTE)})"
    )


def ignored(value: str, phase: RolloutPhase | None) -> str:
    if phase == RolloutPhase.ABORTED:
        return f"{value}: the canary is aborted; retry it ({one_liner(Action.RETRY)}) or change the spec"
    return f"{value} does nothing while the canary is {str(phase or 'Stable').lower()}"


def step_started(s: RevisionsStatus, steps: list[int], pause: int | None) -> str:
    hold = f"for {pause} s" if pause is not None else f"paused until promoted ({one_liner(Action.PROMOTE)})"
    return f"{step(s, steps)}: canary {s.canary} takes {steps[s.canary_step or 0]}% of traffic, {hold}"


def step_done(s: RevisionsStatus, steps: list[int], by: str | None) -> str:
    how = f"promoted by the user ({by})" if by else "passed"
    return f"{step(s, steps)} {how}{_analysis_summary(s)}"


def promoting(canary: str, total: int) -> str:
    return f"every step passed: canary {canary} scales to {total} replicas, then takes all traffic"


def promote_full(canary: str, total: int, value: str) -> str:
    return (
        f"{value}: remaining steps and analysis skipped; canary {canary} scales to {total} replicas, "
        "then takes all traffic"
    )


def promoted(canary: str, slot: Slot, stable: str | None, stable_slot: Slot | None, delay: int) -> str:
    when = f"in {delay} s, once the gateway routes by the new route" if delay else "now"
    return (
        f"{canary} is the stable revision now, in slot {slot}, with no pod restarted; "
        f"the previous stable {stable} (slot {stable_slot}) is removed {when}"
    )


def inconclusive(why: str, s: RevisionsStatus, steps: list[int]) -> str:
    return (
        f"{why}: paused at {step(s, steps)}; promote ({one_liner(Action.PROMOTE)}) "
        f"or abort ({one_liner(Action.ABORT)})"
    )


def aborted(reason: str, s: RevisionsStatus, delay: int) -> str:
    later = f"; its pods are removed in {delay} s" if delay else ""
    return f"{reason}: canary {s.canary} gets no traffic, stable {s.stable} serves all of it{later}"


def deadline_passed(where: str, ready: int, wanted: int, seconds: int, problems: tuple[str, ...]) -> str:
    """The abort's reason: what waited, and why the canary's pods do not run (two of them)."""
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    pods = f": {'; '.join(problems[:2])}{more}" if problems else ""
    waited = f"{ready} of {wanted} canary replicas ready after {seconds} s"
    return f"{where}: {waited} (rollout.canary.progressDeadlineSeconds){pods}"


def _analysis_summary(s: RevisionsStatus) -> str:
    status = s.analysis
    if status is None or not status.metrics:
        return ""
    if status.phase == AnalysisPhase.PENDING:
        return "; analysis starts when the step's weight is in effect"
    good = min(ms.step_successful for ms in status.metrics)
    waiting = [str(ms.name) for ms in status.metrics if ms.step_successful == 0]
    text = f"; analysis: {good} successful window{'s' if good != 1 else ''} this step"
    return text + (f", waiting for {', '.join(waiting)}" if waiting else "")


def message(s: RevisionsStatus, spec: CanarySpec | None, route_ready: bool = True) -> str:
    """status.revisions.message: where the rollout stands and what comes next."""
    if s.canary is None or spec is None:
        later = ""
        if s.scale_down_at is not None:
            later = f"; the previous revision's pods are removed at {s.scale_down_at.strftime('%H:%M:%SZ')}"
        return f"revision {s.stable} serves all traffic{later}"
    steps = [step.weight for step in spec.steps]
    if s.phase == RolloutPhase.ABORTED:
        return (
            f"aborted: {s.abort_reason}; stable {s.stable} serves all traffic; retry "
            f"({one_liner(Action.RETRY)}) or change the spec"
        )
    deadline = timers.progress_deadline(s, spec)
    unless = f"; aborted at {deadline.strftime('%H:%M:%SZ')} unless ready" if deadline is not None else ""
    if s.phase == RolloutPhase.PROMOTING:
        return (
            f"promoting {s.canary}: {s.canary_ready_replicas} of {s.canary_replicas} canary replicas "
            f"ready{unless}"
        )
    where = f"{step(s, steps)}, canary weight {s.canary_weight}%"
    if s.phase == RolloutPhase.PAUSED and s.paused_reason == PausedReason.INCONCLUSIVE:
        return f"{where}: paused, analysis inconclusive; promote or abort"
    if s.phase == RolloutPhase.PAUSED:
        return f"{where}: paused until promoted ({one_liner(Action.PROMOTE)}){_analysis_summary(s)}"
    if s.step_started_at is None and not route_ready:
        return f"{where}: waiting for the Gateway to accept the HTTPRoute"
    if s.step_started_at is None:
        return (
            f"{where}: waiting for the weight to take effect "
            f"({s.canary_ready_replicas} of {s.canary_replicas} canary replicas ready{unless})"
        )
    # The end time, not a countdown: the message changes only when the rollout does, so writing
    # status does not wake the operator again every second.
    pause = spec.steps[s.canary_step or 0].pause_seconds or 0
    end = (s.step_started_at + timedelta(seconds=pause)).strftime("%H:%M:%SZ")
    return f"{where} for {pause} s, until {end}{_analysis_summary(s)}"
