"""The decode batch: the running groups in the order they joined, with lazily advanced counters.

Every running group advances by one token per completed step, so a group's `generated` and `kv_len`
are kept as of its `synced_step` and brought up to date only when needed (`sync`). The flattened
sequence ids, and the position each one writes, are cached until the batch changes.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter

import numpy as np

from workbench.clock.step_cost import CostMeter
from workbench.engine.groups import Group, GroupState
from workbench.engine.plan import NO_SLOTS

_JOINED = attrgetter("joined")


class DecodeBatch:
    """Mutates the groups it holds and the cost meter's decode totals."""

    def __init__(self, meter: CostMeter) -> None:
        self.groups: list[Group] = []  # RUNNING groups, in the order they joined
        # the next join number (`Group.joined`): the groups' numbers ascend in batch order, so a leaving group is
        # found by bisection, not by a search of the batch (a preempted group rejoins at the end with a new number)
        self._next_join = 0
        self.meter = meter
        # The flattened sequence ids: a new list at every change (plans keep the old one); None when it
        # must be rebuilt from the groups. While every group has one sequence (`_multi` == 0) a group's
        # position in `groups` is its position here, so joins and leaves edit the list in C.
        self._ids: list[int] | None = []
        self._multi = 0  # groups with more than one sequence
        self._request_list: list[int] = []  # the groups' request indices, batch order
        self._requests: tuple[int, ...] | None = ()  # that list as a tuple, built once per change
        # A decoding sequence writes position `_pos_base + step`, generated token `_pos_base + step -
        # _prompt_len`. Per group, kv_len - synced_step is fixed while it runs (a sync adds the same lag to both),
        # so the groups' values are kept in lists edited at each join and leave, batch order.
        self._group_base: list[int] = []
        self._group_prompt: list[int] = []
        # While every group has one sequence the same values per sequence are also kept in arrays edited in
        # place at each join and leave (`_seq_arrays`), so a step reads them without building arrays from the
        # lists (a step's batch changes at most steps); built at the first `positions` (a run whose strategy
        # reads no token ids never asks), dropped while a group has several sequences. Then they are
        # rebuilt from the groups when the ids change (`_batch` is the list they describe).
        self._seq_arrays: _SeqArrays | None = None
        self._batch: list[int] | None = None
        self._batch_ids = NO_SLOTS  # int64 [num_decode]
        self._pos_base = NO_SLOTS  # int64 [num_decode]
        self._prompt_len = NO_SLOTS  # int64 [num_decode]

    def __bool__(self) -> bool:
        return bool(self.groups)

    def ids(self) -> list[int]:
        """The running sequences in batch order (one list until the batch changes: plans may keep it)."""
        if self._ids is None:
            self._ids = [s for g in self.groups for s in g.seq_ids]
        return self._ids

    def requests(self) -> tuple[int, ...]:
        """The running groups' request indices, batch order (cached until the batch changes)."""
        if self._requests is None:
            self._requests = tuple(self._request_list)
        return self._requests

    def positions(self, ids: list[int], step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int64 [num_decode] each, new arrays: the sequence ids of `ids` (this batch's list), the position each
        writes at `step`, and the index of the generated token it writes."""
        if not self._multi:
            if self._seq_arrays is None:
                self._seq_arrays = _SeqArrays()
                for g, base, prompt in zip(self.groups, self._group_base, self._group_prompt, strict=True):
                    self._seq_arrays.append(g.seq_ids[0], base, prompt)
            seq_ids, base, prompt = self._seq_arrays.view()
            positions = base + step
            return seq_ids.copy(), positions, positions - prompt
        if self._batch is not ids:
            self._batch_ids = np.asarray(ids, dtype=np.int64)
            # a running group's kv_len lags by (step - synced_step): position = kv_len - synced_step + step
            sizes = [len(g.seq_ids) for g in self.groups]  # each group's values once per sequence
            self._pos_base = np.repeat(np.array(self._group_base, dtype=np.int64), sizes)
            self._prompt_len = np.repeat(np.array(self._group_prompt, dtype=np.int64), sizes)
            self._batch = ids
        positions = self._pos_base + step
        return self._batch_ids, positions, positions - self._prompt_len

    @staticmethod
    def sync(g: Group, step: int) -> None:
        """Bring a group's counters up to `step` (completed steps)."""
        lag = step - g.synced_step
        if g.state == GroupState.RUNNING and lag:
            g.generated += lag
            g.kv_len += lag
        g.synced_step = step

    def advanced(self, extra: np.ndarray, step: int) -> None:
        """Speculative decoding: the step that completed as `step` advanced each running group (batch order,
        one sequence each) by 1 + extra[i] tokens; the lazy counters and the meter counted the 1."""
        for i, (g, more) in enumerate(zip(self.groups, extra.tolist(), strict=True)):
            self.sync(g, step)
            if more:
                self.meter.add(g.kv_len, g.num_seqs, step, -1)
                g.generated += more
                g.kv_len += more
                self.meter.add(g.kv_len, g.num_seqs, step, +1)
                self._group_base[i] = g.kv_len - g.synced_step
                if self._seq_arrays is not None:
                    self._seq_arrays.set_base(i, self._group_base[i])
        self._batch = None  # the positions move with the bases

    def join(self, g: Group, step: int) -> None:
        """A group with tokens left to generate starts decoding at `step`."""
        g.state = GroupState.RUNNING
        g.joined = self._next_join
        self._next_join += 1
        self.groups.append(g)
        self._request_list.append(g.index)
        self._group_base.append(g.kv_len - g.synced_step)
        self._group_prompt.append(g.request.prompt_tokens)
        self._requests = None
        self._multi += g.num_seqs > 1
        if self._ids is not None:  # extend the batch (a new list: plans keep the old one)
            self._ids = self._ids + g.seq_ids
        if self._multi:
            self._seq_arrays = None
        elif self._seq_arrays is not None:
            self._seq_arrays.append(g.seq_ids[0], self._group_base[-1], self._group_prompt[-1])
        self.meter.add(g.kv_len, g.num_seqs, step, +1)

    def leave(self, g: Group, step: int) -> None:
        """A running group stops decoding (finished or preempted); its counters are synced."""
        self.sync(g, step)
        i = bisect_left(self.groups, g.joined, key=_JOINED)
        if i == len(self.groups) or self.groups[i] is not g:
            raise ValueError(f"group of request {g.index} leaves a decode batch it is not in")
        del self.groups[i]
        del self._request_list[i]
        del self._group_base[i]
        del self._group_prompt[i]
        self._requests = None
        if self._ids is not None and not self._multi and g.num_seqs == 1:
            self._ids = self._ids[:i] + self._ids[i + 1:]
        else:
            self._ids = None
        self._multi -= g.num_seqs > 1
        if self._seq_arrays is not None:
            self._seq_arrays.delete(i)
        self.meter.add(g.kv_len, g.num_seqs, step, -1)

    def reshaped(self) -> None:
        """A running group's sequences changed (beam branching): rebuild the ids."""
        self._ids = None
        self._multi = sum(g.num_seqs > 1 for g in self.groups)
        self._seq_arrays = None


class _SeqArrays:
    """Per decoding sequence, batch order: its id, position base and prompt length, int64 arrays grown by
    doubling and edited in place (a join writes one entry, a leave shifts the later ones down)."""

    def __init__(self) -> None:
        self.n = 0
        self._values = np.zeros((3, 64), dtype=np.int64)  # rows: sequence id, position base, prompt length

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of the live entries: read them before the next join or leave."""
        v = self._values[:, :self.n]
        return v[0], v[1], v[2]

    def append(self, seq_id: int, base: int, prompt: int) -> None:
        if self.n == self._values.shape[1]:
            self._values = np.concatenate([self._values, np.zeros_like(self._values)], axis=1)
        self._values[:, self.n] = (seq_id, base, prompt)
        self.n += 1

    def delete(self, i: int) -> None:
        self._values[:, i:self.n - 1] = self._values[:, i + 1:self.n]
        self.n -= 1

    def set_base(self, i: int, base: int) -> None:
        self._values[1, i] = base
