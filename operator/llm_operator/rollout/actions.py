"""User actions on a canary: the annotation llmoperator.io/rollout-action.

`kubectl annotate llmd NAME llmoperator.io/rollout-action=promote/$(date +%s) --overwrite`: the
value is an action, optionally followed by /TOKEN so the same action can be asked again. The
operator handles each value once and echoes it in status.revisions.lastAction, so a restart or a
later reconcile never repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

ANNOTATION = "llmoperator.io/rollout-action"


class Action(StrEnum):
    PROMOTE = "promote"  # end the current step (its pause, the analysis gate) and go to the next
    PROMOTE_FULL = "promote-full"  # skip every remaining step and the analysis
    ABORT = "abort"  # the canary gets no traffic, the stable all of it
    RETRY = "retry"  # an aborted canary starts again at step 1


@dataclass(frozen=True)
class Request:
    value: str  # the annotation's value as written, echoed in lastAction
    action: Action | None  # None: not an action this operator knows


def pending(value: str | None, last: str | None) -> Request | None:
    """The annotation's request, unless it is absent or was handled already."""
    if value is None or not value.strip() or value == last:
        return None
    name = value.split("/", 1)[0].strip().lower()
    try:
        return Request(value, Action(name))
    except ValueError:
        return Request(value, None)


def one_liner(action: Action) -> str:
    return f"kubectl annotate llmd NAME {ANNOTATION}={action}/$(date +%s) --overwrite"
