"""The rollout state machine: spec, status and observations -> what to render and the new status.

Pure. Every timer lives in status.revisions (stepStartedAt, nextMeasurementAt, abortedAt), so a
restarted operator that calls decide() with the status it wrote resumes at the same step.

- rolling strategy: the current revision is always the stable one, in the stable slot.
- canary strategy: a spec whose revision differs from the stable one starts a canary in the other
  slot at step 0. A step's timer starts once its weight is in effect; it advances after its pause
  and, with analysis, after a Successful window of every metric during the step. After the last
  step the canary is scaled to the full count, takes all traffic and becomes the stable revision
  in its own slot (no pod restarts); the old slot is removed, with gateway-api only after
  scaleDownDelaySeconds (a gateway may still route by the previous route for a moment).
- Failed or Error analysis aborts (no canary traffic, stable back to full); Inconclusive pauses
  until a person promotes or aborts. A new spec mid-canary restarts at step 0 in the same slot; a
  spec equal to the stable revision removes the canary at once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from llm_operator.api.v1alpha1 import (
    AnalysisPhase,
    AnalysisStatus,
    CanarySpec,
    LLMDeploymentSpec,
    PausedReason,
    RevisionsStatus,
    RolloutPhase,
    RolloutStrategy,
    TrafficRouting,
)
from llm_operator.rollout import analysis as an
from llm_operator.rollout import split, timers, words
from llm_operator.rollout.actions import Action, Request, pending
from llm_operator.rollout.timers import ACTIVE
from llm_operator.rollout.types import Decision, Event, Measurement, Slot, SlotObserved, SlotTarget


def other(slot: Slot) -> Slot:
    return Slot.B if slot == Slot.A else Slot.A


def decide(
    spec: LLMDeploymentSpec,
    revision: str,
    old: RevisionsStatus | None,
    slots: dict[Slot, SlotObserved],
    total: int,
    measurements: list[Measurement] | None,
    action: str | None,
    now: datetime,
    route_ready: bool = True,
    problems: dict[Slot, tuple[str, ...]] | None = None,
) -> Decision:
    """`revision`: the current spec's; `total`: the replicas to serve (spec or autoscaler);
    `measurements`: the windows taken because the last Decision asked (measure=True);
    `action`: the rollout-action annotation's value; `route_ready` (gateway-api): the HTTPRoute as
    last applied is accepted by its parents, so its weights are in effect; `problems`: per slot,
    "pod: why" of its pods that cannot run (an abort for the progress deadline names them)."""
    now = (now if now.tzinfo is not None else now.replace(tzinfo=UTC)).replace(microsecond=0)
    machine = _Machine(spec, revision, old, slots, total, now, route_ready, problems or {})
    return machine.run(measurements, action)


class _Machine:
    def __init__(
        self,
        spec: LLMDeploymentSpec,
        revision: str,
        old: RevisionsStatus | None,
        slots: dict[Slot, SlotObserved],
        total: int,
        now: datetime,
        route_ready: bool,
        problems: dict[Slot, tuple[str, ...]],
    ) -> None:
        rollout = spec.rollout
        self.canary_spec: CanarySpec | None = (
            rollout.canary if rollout.strategy == RolloutStrategy.CANARY else None
        )
        self.revision, self.observed, self.total = revision, slots, max(total, 0)
        self.now, self.route_ready, self.problems = now, route_ready, problems
        self.old = old or RevisionsStatus()
        self.events: list[Event] = []
        self.measure = False
        self.s = self.old
        if self.s.stable is None:  # first sight: what the spec says now is what serves
            self.s = RevisionsStatus(stable=revision, stable_slot=Slot.A, last_action=self.old.last_action)
        if self.s.stable_slot is None:
            self.set(stable_slot=Slot.A)

    def set(self, **changes: Any) -> None:
        self.s = self.s.model_copy(update=changes)

    def event(self, warning: bool, reason: str, message: str) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))

    # -- entry --------------------------------------------------------------------------------

    def run(self, measurements: list[Measurement] | None, action: str | None) -> Decision:
        request = pending(action, self.s.last_action)
        if self.canary_spec is None:
            self.rolling()
        else:
            self.follow_spec()
            self.sync_analysis()
        if request is not None:
            self.act(request)
        if self.canary_spec is not None and self.s.canary is not None:
            self.analyse(measurements)
            for _ in range(len(self.canary_spec.steps) + 3):  # transitions that need no new observation
                before = self.s
                self.progress()
                if self.s == before:
                    break
        return self.finish()

    def rolling(self) -> None:
        if self.s.canary is not None:
            self.event(False, "CanaryCancelled", words.cancelled(self.s.canary, self.revision))
        self.s = RevisionsStatus(
            stable=self.revision, stable_slot=self.s.stable_slot, last_action=self.s.last_action
        )

    def follow_spec(self) -> None:
        s = self.s
        if self.revision == s.stable:
            if s.canary is not None:
                self.event(False, "CanaryRolledBack", words.rolled_back(s.stable, s.canary))
                self.clear_canary()
        elif s.canary is None:
            slot = other(s.stable_slot or Slot.A)
            self.begin(self.revision, slot)
            self.event(False, "CanaryStarted", words.started(self.revision, slot, s.stable, self.steps()))
        elif self.revision != s.canary:
            self.event(False, "CanaryRestarted", words.restarted(self.revision, s.canary, s.canary_slot))
            self.begin(self.revision, s.canary_slot or other(s.stable_slot or Slot.A))
        else:
            self.set(canary_step=min(s.canary_step or 0, len(self.steps()) - 1))

    def clear_canary(self) -> None:
        self.s = RevisionsStatus(
            stable=self.s.stable,
            stable_slot=self.s.stable_slot,
            phase=RolloutPhase.STABLE,
            last_action=self.s.last_action,
        )

    def begin(self, revision: str, slot: Slot) -> None:
        self.s = RevisionsStatus(
            stable=self.s.stable,
            stable_slot=self.s.stable_slot,
            canary=revision,
            canary_slot=slot,
            canary_step=0,
            phase=RolloutPhase.PROGRESSING,
            last_action=self.s.last_action,
        )
        self.sync_analysis()

    def sync_analysis(self) -> None:
        """The analysis status follows the spec: added, removed or its metrics changed."""
        spec = self.canary_spec.analysis if self.canary_spec is not None else None
        if spec is None or self.s.canary is None:
            self.set(analysis=None)
            return
        current = self.s.analysis or AnalysisStatus(phase=AnalysisPhase.PENDING)
        have = {ms.name: ms for ms in current.metrics}
        metrics = [have.get(ms.name, ms) for ms in an.fresh(spec)]
        self.set(analysis=current.model_copy(update={"metrics": metrics}))
        if current.phase == AnalysisPhase.PENDING and self.s.step_started_at is not None:
            self.start_analysis(self.now)

    def start_analysis(self, at: datetime) -> None:
        assert self.canary_spec is not None and self.canary_spec.analysis is not None
        spec = self.canary_spec.analysis
        first = at + timedelta(seconds=spec.initial_delay_seconds + spec.interval_seconds)
        self.set(
            analysis=AnalysisStatus(
                phase=AnalysisPhase.RUNNING,
                started_at=at,
                next_measurement_at=first,
                metrics=an.fresh(spec),
            )
        )

    # -- user actions -------------------------------------------------------------------------

    def act(self, request: Request) -> None:
        self.set(last_action=request.value)
        phase, value = self.s.phase, request.value
        if request.action is None:
            self.event(True, "UnknownRolloutAction", words.unknown_action(value))
        elif self.s.canary is None:
            self.event(True, "RolloutActionIgnored", f"{value}: no canary rollout is in progress")
        elif request.action == Action.ABORT and phase != RolloutPhase.ABORTED:
            self.abort(f"aborted by the user ({value})")
        elif request.action == Action.RETRY and phase == RolloutPhase.ABORTED:
            assert self.s.canary_slot is not None
            self.begin(self.s.canary, self.s.canary_slot)
            self.event(False, "CanaryRetried", words.retried(self.s.canary, value))
        elif request.action == Action.PROMOTE and phase in ACTIVE:
            self.event(False, "CanaryStepCompleted", words.step_done(self.s, self.steps(), value))
            if self.s.paused_reason == PausedReason.INCONCLUSIVE:
                self.start_analysis(self.now)  # a new analysis run, as Argo Rollouts starts one
            self.advance()
        elif request.action == Action.PROMOTE_FULL and phase in ACTIVE:
            self.promoting(words.promote_full(self.s.canary, self.total, value))
        else:
            self.event(True, "RolloutActionIgnored", words.ignored(value, phase))

    # -- analysis -----------------------------------------------------------------------------

    def analyse(self, measurements: list[Measurement] | None) -> None:
        assert self.canary_spec is not None
        spec, status = self.canary_spec.analysis, self.s.analysis
        if spec is None or status is None or status.phase != AnalysisPhase.RUNNING:
            return
        if self.s.phase not in ACTIVE or self.s.paused_reason == PausedReason.INCONCLUSIVE:
            return
        due = status.next_measurement_at is None or self.now >= status.next_measurement_at
        if not due:
            return
        if measurements is None:
            self.measure = True
            return
        metrics, judged = an.measure(status.metrics, measurements, spec, self.now)
        phase, why = an.verdict(metrics, spec)
        nxt = self.now + timedelta(seconds=spec.interval_seconds)
        self.set(
            analysis=status.model_copy(
                update={"metrics": metrics, "next_measurement_at": nxt, "phase": phase}
            )
        )
        if judged:
            worst = max((p for p, _ in judged), key=words.SEVERITY.__getitem__)
            self.event(worst != AnalysisPhase.SUCCESSFUL, f"Analysis{worst}", "; ".join(m for _, m in judged))
        if phase in (AnalysisPhase.FAILED, AnalysisPhase.ERROR):
            self.abort(why or "analysis failed")
        elif phase == AnalysisPhase.INCONCLUSIVE:
            self.set(phase=RolloutPhase.PAUSED, paused_reason=PausedReason.INCONCLUSIVE)
            self.event(True, "CanaryInconclusive", words.inconclusive(why or "", self.s, self.steps()))

    def abort(self, reason: str) -> None:
        assert self.canary_spec is not None
        self.set(
            phase=RolloutPhase.ABORTED,
            paused_reason=None,
            aborted_at=self.now,
            abort_reason=reason,
            step_started_at=None,
            waiting_since=None,
        )
        delay = self.canary_spec.abort_scale_down_delay_seconds if self.gateway() else 0
        self.event(True, "RolloutAborted", words.aborted(reason, self.s, delay))

    # -- steps --------------------------------------------------------------------------------

    def steps(self) -> list[int]:
        assert self.canary_spec is not None
        return [step.weight for step in self.canary_spec.steps]

    def gateway(self) -> bool:
        return self.canary_spec is not None and self.canary_spec.traffic_routing == TrafficRouting.GATEWAY_API

    def progress(self) -> None:
        if self.s.phase == RolloutPhase.PROGRESSING:
            self.progress_step()
        elif self.s.phase == RolloutPhase.PROMOTING:
            self.progress_promotion()

    def progress_step(self) -> None:
        assert self.canary_spec is not None
        index = self.s.canary_step or 0
        step = self.canary_spec.steps[index]
        started = self.s.step_started_at
        if started is None:
            if not self.split().reached:
                self.wait_for_weight()
                return
            self.set(step_started_at=self.now, waiting_since=None)
            status = self.s.analysis
            if status is not None and status.phase == AnalysisPhase.PENDING:
                self.start_analysis(self.now)
            elif status is not None:
                self.set(analysis=status.model_copy(update={"metrics": an.new_step(status.metrics)}))
            self.event(
                False, "CanaryStepStarted", words.step_started(self.s, self.steps(), step.pause_seconds)
            )
            if step.pause_seconds is None:
                self.set(phase=RolloutPhase.PAUSED, paused_reason=PausedReason.UNTIL_PROMOTED)
            return
        if step.pause_seconds is None or self.now < started + timedelta(seconds=step.pause_seconds):
            return
        analysis, status = self.canary_spec.analysis, self.s.analysis
        if analysis is not None and status is not None and an.missing_successes(status.metrics, analysis):
            return
        self.event(False, "CanaryStepCompleted", words.step_done(self.s, self.steps(), None))
        if status is not None and self.s.canary_step == len(self.steps()) - 1:
            self.set(analysis=status.model_copy(update={"phase": AnalysisPhase.SUCCESSFUL}))
        self.advance()

    def advance(self) -> None:
        index = (self.s.canary_step or 0) + 1
        if index >= len(self.steps()):
            assert self.s.canary is not None
            self.promoting(words.promoting(self.s.canary, self.total))
            return
        self.set(
            canary_step=index,
            step_started_at=None,
            waiting_since=None,
            phase=RolloutPhase.PROGRESSING,
            paused_reason=None,
        )

    def promoting(self, message: str) -> None:
        self.set(phase=RolloutPhase.PROMOTING, paused_reason=None, step_started_at=None, waiting_since=None)
        self.event(False, "CanaryPromoting", message)

    def progress_promotion(self) -> None:
        if not self.split().reached:
            self.wait_for_weight()
            return
        # gateway-api: the route must have carried all traffic to the canary before the swap: the
        # previous decision applied it at 100 (the last step's weight, or promoting), and the
        # gateway has accepted that route (split().reached).
        if self.gateway() and (self.old.canary != self.s.canary or self.old.canary_weight != 100):
            return
        s = self.s
        assert s.canary is not None and s.canary_slot is not None
        assert self.canary_spec is not None
        delay = self.canary_spec.scale_down_delay_seconds if self.gateway() else 0
        self.event(
            False, "CanaryPromoted", words.promoted(s.canary, s.canary_slot, s.stable, s.stable_slot, delay)
        )
        self.s = RevisionsStatus(
            stable=s.canary,
            stable_slot=s.canary_slot,
            phase=RolloutPhase.STABLE,
            last_action=s.last_action,
            scale_down_at=self.now + timedelta(seconds=delay) if delay else None,
        )

    def wait_for_weight(self) -> None:
        """The weight of the step (or the promotion) is not in effect yet. The progress deadline
        runs from the first pass that sees the canary's workloads on its revision: an engine still
        building for it does not count."""
        assert self.canary_spec is not None
        s = self.s
        seen = self.observed.get(s.canary_slot) if s.canary_slot is not None else None
        if seen is None or not seen.exists or seen.revision != s.canary:
            return
        if s.waiting_since is None:
            self.set(waiting_since=self.now)
        deadline = timers.progress_deadline(self.s, self.canary_spec)
        if deadline is not None and self.now >= deadline:
            assert s.canary_slot is not None
            ready, wanted = self.ready(s.canary_slot, s.canary), self.split().canary
            where = words.step(s, self.steps()) if s.phase == RolloutPhase.PROGRESSING else "the promotion"
            seconds = self.canary_spec.progress_deadline_seconds
            problems = self.problems.get(s.canary_slot, ())
            self.abort(words.deadline_passed(where, ready, wanted, seconds, problems))

    # -- what to render -----------------------------------------------------------------------

    def ready(self, slot: Slot | None, revision: str | None) -> int:
        return split.ready_of(self.observed, slot, revision)

    def split(self) -> split.Split:
        return split.of_rollout(
            self.s, self.canary_spec, self.observed, self.total, self.now, self.route_ready
        )

    def finish(self) -> Decision:
        s = self.s
        assert s.stable is not None and s.stable_slot is not None
        sp = self.split()
        targets = {s.stable_slot: SlotTarget(s.stable, sp.stable)}
        if s.canary is not None and s.canary_slot is not None:
            targets[s.canary_slot] = SlotTarget(s.canary, sp.canary)
        if s.scale_down_at is not None and (s.canary is not None or self.now >= s.scale_down_at):
            self.set(scale_down_at=None)
        stable_ready = self.ready(s.stable_slot, s.stable)
        for slot, seen in self.observed.items():
            # A slot that left the rollout (rollback, swap, cancel) stays only while the stable
            # has no ready replica and it does: it bridges, so something always serves. The slot
            # a gateway-api promotion replaced stays until its scale-down time.
            bridge = stable_ready == 0 and self.total > 0 and seen.ready > 0
            if slot not in targets and seen.exists and seen.revision and (bridge or self.s.scale_down_at):
                targets[slot] = SlotTarget(seen.revision, seen.replicas)
        canary = s.canary is not None
        was_aborted = s.phase == self.old.phase == RolloutPhase.ABORTED
        if was_aborted and (self.old.canary_replicas or 0) > 0 and sp.canary == 0:
            self.event(False, "CanaryScaledDown", f"aborted canary {s.canary} scaled to 0 replicas")
        self.set(
            stable_replicas=sp.stable,
            stable_ready_replicas=stable_ready,
            canary_replicas=sp.canary if canary else None,
            canary_ready_replicas=self.ready(s.canary_slot, s.canary) if canary else None,
            canary_weight=sp.weight if canary else None,
            phase=s.phase or RolloutPhase.STABLE,
        )
        self.set(message=words.message(self.s, self.canary_spec, self.route_ready or not self.gateway()))
        return Decision(
            revisions=self.s,
            slots=targets,
            weights=dict(sp.route),
            events=self.events,
            requeue_after=timers.requeue_after(self.s, self.canary_spec, self.gateway(), self.now),
            measure=self.measure,
        )
