"""A miniature engine for hybrid pools: the `alloc_model` idea, one table per layer group.

The fake pool stores token ids. Each group's writes go through its own slot mapping (unit 0, as the
engine's kernel layer), after the prefix hit only, as the engine writes: a hit's blocks must already
hold the prompt's tokens. `verify()` reads every live position of every group back through
`group_slot_mapping` and `describe_group`, and `reference_partition()` recomputes each group's
token / reserved / internal split from those mappings alone.
"""

from __future__ import annotations

import numpy as np

from tests.allocators.block_partition import block_partition
from workbench.allocators.values import SeqSpec


class HybridPoolModel:
    def __init__(self, strategy) -> None:
        self.s = strategy
        self.bs = strategy.block_size
        self.device = np.full(strategy.capacity_slots, -1, dtype=np.int64)  # [capacity_slots] token ids
        self.tokens: dict[int, list[int]] = {}
        self.final: dict[int, int] = {}

    def admit(self, seq_ids: list[int], prompt: np.ndarray, final_len: int):
        result = self.s.admit(seq_ids, SeqSpec(prompt.astype(np.int32), final_len))
        if result.admitted:
            start = result.cached_tokens
            for g in range(len(self.s.groups)):
                self.device[self.s.group_slot_mapping(g, seq_ids[0], start, prompt.shape[0])] = prompt[start:]
            for seq_id in seq_ids:
                self.tokens[seq_id] = prompt.tolist()
                self.final[seq_id] = final_len
        return result

    def append(self, seq_ids: list[int], rng: np.random.Generator, *, if_room: bool = False) -> None:
        new = rng.integers(0, 1000, len(seq_ids))
        call = self.s.append_if_room if if_room else self.s.append
        result = call(seq_ids, new.astype(np.int32) if self.s.wants_token_ids else None)
        assert result is not None, "append_if_room refused an append the pool has room for"
        for src, dst in result.copies.tolist():
            self.device[dst * self.bs:(dst + 1) * self.bs] = self.device[src * self.bs:(src + 1) * self.bs]
        for slots in result.group_slots:  # [num_seqs] per group
            assert np.unique(slots).shape[0] == len(seq_ids), "two sequences write one slot"
            self.device[slots] = new
        for seq_id, token in zip(seq_ids, new.tolist(), strict=True):
            self.tokens[seq_id].append(token)

    def fork(self, parent: int, child: int):
        result = self.s.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.final[child] = self.final[parent]
        return result

    def free(self, seq_id: int) -> None:
        self.s.free(seq_id)
        del self.tokens[seq_id], self.final[seq_id]

    def live_start(self, group: int, seq_id: int) -> int:
        """First position of the sequence still held by the group."""
        return int(self.s.groups[group].first_live[self.s.seqs.row(seq_id)]) * self.bs

    def verify(self) -> None:
        """Every live position of every group reads back its token, through slot mapping and descriptor;
        a window group still holds every position its last query (at length − 1) reads."""
        ids = list(self.tokens)
        for g, tables in enumerate(self.s.groups):
            mappings = []
            for seq_id in ids:
                length, start = len(self.tokens[seq_id]), self.live_start(g, seq_id)
                if tables.window_tokens is not None:
                    assert start <= max(0, length - tables.window_tokens), "a readable position was released"
                slots = self.s.group_slot_mapping(g, seq_id, start, length)
                assert np.array_equal(self.device[slots], self.tokens[seq_id][start:]), f"seq {seq_id} reads wrong KV"
                mappings.append(slots)
            if ids:
                d = self.s.describe_group(g, ids)
                for k, (seq_id, slots) in enumerate(zip(ids, mappings, strict=True)):
                    table = d.kv_indices[d.kv_indptr[k]:d.kv_indptr[k + 1]]
                    length, start = len(self.tokens[seq_id]), self.live_start(g, seq_id)
                    pos = np.arange(start, length)
                    assert table.shape[0] == -(-length // self.bs)
                    assert np.array_equal(table[pos // self.bs].astype(np.int64) * self.bs + pos % self.bs, slots)

    def reference_partition(self) -> list[tuple[int, int, int, int]]:
        """Per group (token, reserved, internal, held) slots from the slot mappings and final lengths."""
        out = []
        for g, tables in enumerate(self.s.groups):
            starts = {seq_id: self.live_start(g, seq_id) for seq_id in self.tokens}
            written, reach = block_partition(
                ((self.s.group_slot_mapping(g, i, starts[i], len(self.tokens[i])), starts[i], self.final[i])
                 for i in self.tokens), self.bs)
            token = int(written.sum())
            reserved = int((reach - written).sum())
            held = written.shape[0] * self.bs
            u = tables.units
            out.append((token * u, reserved * u, (held - token - reserved) * u, held * u))
        return out
