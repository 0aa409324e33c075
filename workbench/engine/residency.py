"""Which groups hold device KV, and every way a group leaves or re-enters the device (docs/engine.md).

A group holds device KV while it is STARTING, PREFILLING or RUNNING. It leaves when it finishes
(its blocks freed, or held until a link has read them: a disaggregated prefill replica), when it is
preempted (swapped to the host pool, or freed for recompute and put back at the head of the waiting
queue) and when it is rejected because it outgrows the pool alone. Swapped groups come back last
preempted first. The counters here are what admission's bounds read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from workbench.allocators.base import Strategy
from workbench.engine.groups import Group, GroupState
from workbench.engine.plan import Resumed
from workbench.engine.request_log import RequestLog


class Residency:
    """Owns the swapped and held groups and the count of sequences on the device; mutates the strategy, the
    waiting queue and the request log it is given."""

    def __init__(self, strategy: Strategy, log: RequestLog, waiting: deque[Group], *,
                 leave_batch: Callable[[Group, int], None], reject: Callable[[Group, str], None],
                 drop_partial: Callable[[], None], swap: bool, max_num_seqs: int) -> None:
        """`leave_batch`: a running group leaves the decode batch at a step (`DecodeBatch.leave`); `reject`:
        admission's rejection; `drop_partial`: the partial prefill is abandoned (chunked prefill)."""
        self.strategy = strategy
        self.log = log
        self.waiting = waiting
        self.leave_batch = leave_batch
        self.reject = reject
        self.drop_partial = drop_partial
        self.swap = swap  # else preemption recomputes
        self.max_num_seqs = max_num_seqs
        self.num_running_seqs = 0  # sequences holding device KV: RUNNING and STARTING groups
        self.swapped: list[Group] = []  # preempted to the host pool; the last preempted returns first
        self.held: dict[int, Group] = {}  # request index -> a finished group whose blocks are still allocated
        self.held_seqs = 0  # their sequences: not running, but their blocks will come free

    def finish(self, g: Group, step: int) -> None:
        """Mutates. The group finished at `step`: its blocks are freed, or held until `release` when a link
        will read them."""
        if g.holds_kv:
            self.leave(g, step)
            self.held[g.index] = g
            self.held_seqs += g.num_seqs
        else:
            self.free(g, step)

    def release(self, index: int) -> None:
        """Mutates. The held request `index` (finished, its KV read by a link) frees its blocks."""
        g = self.held.pop(index)
        for seq_id in g.seq_ids:
            self.strategy.free(seq_id)
        self.held_seqs -= g.num_seqs

    def preempt(self, g: Group, swap_out: list[np.ndarray], step: int) -> None:
        """Mutates. Take a running group off the device, all or nothing: swap it to the host pool when
        swapping is on and the host has room (its moves go to `swap_out`), else free it for recompute."""
        partial = g.state == GroupState.PREFILLING  # a partial prefill is recomputed, never swapped
        if partial:
            self.drop_partial()
        self.log.preempted(g.index)
        if self.swap and not partial and self.strategy.can_swap_out(g.seq_ids):
            self.leave(g, step)
            swap_out.append(self.strategy.swap_out(g.seq_ids).moves)
            g.state = GroupState.SWAPPED
            self.swapped.append(g)
            return
        self.free(g, step)
        g.state = GroupState.WAITING
        self.waiting.appendleft(g)

    def swap_in(self, started: list[Resumed], swap_in: list[np.ndarray]) -> None:
        """Mutates. Swapped groups come back, last preempted first, while `max_num_seqs` and the pool allow;
        their moves go to `swap_in`."""
        while self.swapped:
            g = self.swapped[-1]
            if self.num_running_seqs + g.num_seqs > self.max_num_seqs or not self.strategy.can_swap_in(g.seq_ids):
                return
            self.swapped.pop()
            swap_in.append(self.strategy.swap_in(g.seq_ids).moves)
            g.state = GroupState.STARTING
            self.num_running_seqs += g.num_seqs
            started.append(Resumed(g.index, g.num_seqs, g.kv_len))

    def retire(self, g: Group, reason: str, step: int) -> None:
        """Mutates. The only holder of the pool cannot grow: free it and reject it."""
        self.free(g, step)
        self.reject(g, reason)

    def free(self, g: Group, step: int) -> None:
        """The group leaves the device and its sequences' KV is freed."""
        self.leave(g, step)
        for seq_id in g.seq_ids:
            self.strategy.free(seq_id)

    def leave(self, g: Group, step: int) -> None:
        """The group stops holding device KV (finished, preempted or rejected); its counters are synced."""
        if g.state == GroupState.RUNNING:
            self.leave_batch(g, step)
        self.num_running_seqs -= g.num_seqs
        g.epoch += 1
