"""A multi-node group's stall, seen from its leader: requests in flight and no response from Triton.

A member of a group that freezes (a rank stopped, a GPU or NCCL hang, a host that stops answering
without closing its connections) leaves the rest of the world waiting in a collective: rank 0's
Triton stays live, so its probes stay green, and every request hangs (the CPU runtime's gloo gives
up after pipeline.TIMEOUT, 300 s; NCCL and MPI may wait forever). The front door of the leader
sees it: every OpenAI request passes through it, and a healthy engine answers some request of those
in flight at least once per token step or prefill. When none has had any response (a token, an
error, a whole answer) for `timeout` seconds while at least one was in flight all along, the front
door says so on one line (STALLED_PREFIX, which the launcher keeps for the pod's termination
message) and exits EXIT_STALLED; the launcher stops the world and the pod fails, which the
operator (or LeaderWorkerSet) turns into one group event: the whole group is recreated
(docs/launcher-and-engines.md "Multi-node design").

The clock starts again at every response of any request, and when the front door goes from idle to
busy: a request that arrives while others wait does not hide their stall. Requests sent to Triton's
own endpoints, past the front door, are not watched. Standard library only (the serving images).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.contract import STALLED_PREFIX

# EX_SOFTWARE: the launcher passes a companion's status on as the pod's exit status.
EXIT_STALLED = 70


@dataclass
class StallWatch:
    timeout: float  # seconds; 0: not watched
    in_flight: int = 0
    since: float = 0.0  # the last response, or when the first of those in flight began

    def began(self, now: float) -> None:
        if self.in_flight == 0:
            self.since = now
        self.in_flight += 1

    def answered(self, now: float) -> None:
        """Triton answered one of the requests (a response, an error, a refusal)."""
        self.since = now

    def ended(self) -> None:
        self.in_flight -= 1

    def stalled(self, now: float) -> str | None:
        """Why the world is taken as stalled at `now`, or None."""
        quiet = now - self.since
        if not self.timeout or self.in_flight <= 0 or quiet < self.timeout:
            return None
        return (
            f"{STALLED_PREFIX}no response from Triton for {quiet:.0f} s while {self.in_flight} "
            f"request(s) were in flight (stallTimeoutSeconds {self.timeout:g}): a member of the group "
            "stopped answering; ending the leader so that the group is recreated"
        )
