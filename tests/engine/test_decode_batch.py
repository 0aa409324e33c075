"""The decode batch's positions, kept in place across joins, leaves, beam reshapes and speculative advances,
equal after every operation what the groups themselves say: each sequence writes position kv_len and
generated token kv_len - prompt (its counters synced to the step)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.clock.step_cost import CostMeter
from workbench.engine.decode_batch import DecodeBatch
from workbench.engine.groups import Group
from workbench.workload.request import Request, Segment


def _expected(batch: DecodeBatch, step: int):
    seq_ids, positions, generated = [], [], []
    for g in batch.groups:
        lag = step - g.synced_step
        for s in g.seq_ids:
            seq_ids.append(s)
            positions.append(g.kv_len + lag)
            generated.append(g.kv_len + lag - g.request.prompt_tokens)
    return seq_ids, positions, generated


@pytest.mark.parametrize("seed", range(6))
def test_positions_follow_every_join_leave_reshape_and_advance(seed):
    rng = np.random.default_rng(seed)
    batch = DecodeBatch(CostMeter(16))
    next_seq, step, index = 0, 0, 0
    for _ in range(400):
        op = rng.choice(["join", "leave", "reshape", "advance", "step"], p=[0.3, 0.25, 0.1, 0.1, 0.25])
        if op == "join":
            prompt = int(rng.integers(1, 50))
            g = Group(index, Request(index, 0.0, prompt, 100, (Segment(index, prompt),)), final_len=prompt + 99)
            width = 1 if rng.random() < 0.8 else int(rng.integers(2, 4))
            g.seq_ids = list(range(next_seq, next_seq + width))
            next_seq += width
            g.kv_len, g.generated, g.synced_step = prompt + int(rng.integers(0, 5)), 1, step
            index += 1
            batch.join(g, step)
        elif op == "leave" and batch.groups:
            batch.leave(batch.groups[int(rng.integers(len(batch.groups)))], step)
        elif op == "reshape" and batch.groups:
            g = batch.groups[int(rng.integers(len(batch.groups)))]
            width = int(rng.integers(1, 4))  # a beam branches or is pruned
            g.seq_ids = list(range(next_seq, next_seq + width))
            next_seq += width
            batch.reshaped()
        elif op == "advance" and batch.groups and all(g.num_seqs == 1 for g in batch.groups):
            batch.advanced(rng.integers(0, 3, size=len(batch.groups)), step)
        elif op == "step":
            step += 1
        ids = batch.ids()
        seq_ids, positions, generated = batch.positions(ids, step)
        want = _expected(batch, step)
        assert seq_ids.tolist() == ids == want[0]
        assert positions.tolist() == want[1] and generated.tolist() == want[2]
