"""The rollout's timers, all read from status.revisions: when the machine must look again."""

from __future__ import annotations

from datetime import datetime, timedelta

from llm_operator.api.v1alpha1 import AnalysisPhase, CanarySpec, PausedReason, RevisionsStatus, RolloutPhase

ACTIVE = (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED)


def progress_deadline(s: RevisionsStatus, spec: CanarySpec) -> datetime | None:
    """When a step (or the promotion) still waiting for its weight aborts the canary."""
    if s.waiting_since is None or s.phase not in (RolloutPhase.PROGRESSING, RolloutPhase.PROMOTING):
        return None
    return s.waiting_since + timedelta(seconds=spec.progress_deadline_seconds)


def requeue_after(s: RevisionsStatus, spec: CanarySpec | None, gateway: bool, now: datetime) -> float | None:
    """Seconds to the earliest timer still ahead: a pause's end, a measurement, the progress
    deadline, an aborted or replaced slot's scale-down; None when nothing is timed."""
    timers: list[datetime] = [s.scale_down_at] if s.scale_down_at is not None else []
    if spec is not None and s.canary is not None:
        if s.phase == RolloutPhase.PROGRESSING and s.step_started_at is not None:
            pause = spec.steps[s.canary_step or 0].pause_seconds
            if pause is not None:
                timers.append(s.step_started_at + timedelta(seconds=pause))
        if (
            s.analysis is not None
            and s.analysis.phase == AnalysisPhase.RUNNING
            and s.analysis.next_measurement_at is not None
            and s.phase in ACTIVE
            and s.paused_reason != PausedReason.INCONCLUSIVE
        ):
            timers.append(s.analysis.next_measurement_at)
        if (deadline := progress_deadline(s, spec)) is not None:
            timers.append(deadline)
        if s.phase == RolloutPhase.ABORTED and s.aborted_at is not None and gateway:
            timers.append(s.aborted_at + timedelta(seconds=spec.abort_scale_down_delay_seconds))
    future = [(t - now).total_seconds() for t in timers if t > now]
    return min(future) if future else None
