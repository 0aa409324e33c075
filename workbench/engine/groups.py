"""A request's sequences as one scheduling unit (docs/engine.md).

Sequences of a group advance in lockstep, so per-group counters describe every member: after a
group's prefill step it has generated one token and holds `prompt` KV rows; each decode step
writes the KV of the token fed back and generates the next, so a decoding group always holds
`kv_len = prompt + generated - 1` rows and finishes with `final_len = prompt + output - 1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from workbench.workload.request import Request


class GroupState(IntEnum):
    WAITING = 0  # queued: never admitted, or preempted by recompute
    STARTING = 1  # allocated this step (prefill or swap-in); joins the decode batch at the next step
    RUNNING = 2  # in the decode batch
    SWAPPED = 3  # preempted to the host pool
    DONE = 4  # finished or rejected
    PREFILLING = 5  # chunked prefill: holds the KV of the chunks computed so far; the rest of its prompt waits


@dataclass(eq=False, slots=True)
class Group:
    index: int  # position in the workload, which is sorted by arrival: smaller = arrived earlier
    request: Request
    final_len: int  # KV rows each sequence holds when the request finishes
    seq_ids: list[int] = field(default_factory=list)
    # While RUNNING these two lag by (completed steps - synced_step): decoding advances every group
    # by one per step, so the scheduler adds the lag only when it needs the values (`Scheduler._sync`).
    generated: int = 0  # tokens produced by each sequence so far
    kv_len: int = 0  # KV rows written per sequence
    synced_step: int = 0
    epoch: int = 0  # bumped whenever the group stops running; stale finish entries carry an old epoch
    state: GroupState = GroupState.WAITING
    # disaggregated decode replica: the prompt's KV and first token come from a prefill replica, so the
    # group's first admission writes the shipped rows and computes nothing (a later recompute computes)
    transferred: bool = False
    # disaggregated prefill replica: its KV is shipped to a decode replica after it finishes, so its blocks stay
    # allocated until the fleet says the transfer has ended (`Residency.release`)
    holds_kv: bool = False
    joined: int = -1  # while RUNNING: its number in the decode batch's join order (DecodeBatch finds it by it)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_seqs_requested(self) -> int:
        """Sequences the request runs: its parallel samples or its beams."""
        return self.request.n if self.request.beam_width == 1 else self.request.beam_width
