"""virtual-contiguous gives the attention kernel the same bits as contiguous-oracle for the same request stream.

Both strategies take the same admissions, appends and frees; each sequence's K/V rows are written
through each strategy's own slot mapping into its own pool (for virtual-contiguous, a virtual slot
space larger than the physical capacity), and the contiguous decode kernel runs over each strategy's
descriptor of the whole batch at every step.
"""

from __future__ import annotations

import numpy as np

from tests.engine.conftest import SMALL_MODEL
from workbench import kernels
from workbench.allocators.contiguous.oracle import ContiguousOracle
from workbench.allocators.values import SeqSpec
from workbench.allocators.virtual.contiguous import VirtualContiguous
from workbench.allocators.virtual.pages import KVGeometry
from workbench.engine.kvpool import KVContent, KVPool, content_terms, prefix_sums

HEADS, HEAD_DIM = 2, 16


class Lane:
    """One strategy with its own pool, fed the same operations."""

    def __init__(self, strategy) -> None:
        self.s = strategy
        self.pool = KVPool(strategy.virtual_slots, 0, HEADS, HEAD_DIM, "fp32", "numba")
        self.content = KVContent(HEADS, HEAD_DIM, "fp32")

    def write(self, slots: np.ndarray, tokens: np.ndarray, start: int) -> None:
        k, v = self.content.rows(prefix_sums(content_terms(tokens, np.arange(tokens.shape[0])))[start:])
        self.pool.write(slots, k, v)

    def decode(self, ids: list[int], q: np.ndarray) -> np.ndarray:
        d = self.s.describe(ids)
        return kernels.contiguous_decode(q, self.pool.k, self.pool.v, d.kv_start, d.kv_len, backend="numba")


def test_virtual_contiguous_matches_contiguous_oracle_bit_for_bit():
    rng = np.random.default_rng(7)
    geometry = KVGeometry.of(SMALL_MODEL, "fp32")  # 128-byte rows: 32 tokens per 4 KiB page
    lanes = [Lane(VirtualContiguous(capacity_slots=4096, max_model_len=512, page_kib=4, max_batch=6,
                                    geometry=geometry, page_reuse="on")),
             Lane(ContiguousOracle(capacity_slots=4096, max_model_len=512))]
    tokens: dict[int, np.ndarray] = {}
    final: dict[int, int] = {}
    next_id = 0
    for step in range(120):
        if len(tokens) < 5 and rng.random() < 0.3:
            prompt = rng.integers(0, 1000, int(rng.integers(1, 90))).astype(np.int32)
            spec = SeqSpec(prompt, prompt.shape[0] + int(rng.integers(0, 60)))
            for lane in lanes:
                assert lane.s.admit([next_id], spec).admitted
                lane.write(lane.s.slot_mapping(next_id, 0, prompt.shape[0]), prompt, 0)
            tokens[next_id], final[next_id] = prompt, spec.final_len
            next_id += 1
        ids = [i for i in tokens if tokens[i].shape[0] < final[i]]
        if ids:
            new = rng.integers(0, 1000, len(ids)).astype(np.int32)
            for lane in lanes:
                slots = lane.s.append(ids).slots
                for j, seq_id in enumerate(ids):
                    lane.write(slots[j:j + 1], np.append(tokens[seq_id], new[j]), tokens[seq_id].shape[0])
            for j, seq_id in enumerate(ids):
                tokens[seq_id] = np.append(tokens[seq_id], new[j])
            q = rng.standard_normal((len(ids), 2 * HEADS, HEAD_DIM)).astype(np.float32)
            virtual, oracle = (lane.decode(ids, q) for lane in lanes)
            np.testing.assert_array_equal(virtual, oracle, err_msg=f"step {step}")
        for seq_id in [i for i in tokens if tokens[i].shape[0] == final[i]]:
            for lane in lanes:
                lane.s.free(seq_id)
            del tokens[seq_id], final[seq_id]
        lanes[0].s.check_integrity()
    assert next_id > 8  # extents were released and taken again
