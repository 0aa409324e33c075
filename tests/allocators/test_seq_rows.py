"""SeqRows' cached batch: edited as sequences leave and join, it always gives the rows a fresh lookup gives."""

import numpy as np
import pytest

from workbench.allocators.seq_rows import SeqRows


def fresh_rows(seqs: SeqRows, ids: list[int]) -> np.ndarray:
    return np.array([seqs.row(s) for s in ids], dtype=np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_batch_rows_match_a_fresh_lookup_through_joins_leaves_and_reused_rows(seed):
    rng = np.random.default_rng(seed)
    seqs = SeqRows(("length",), capacity_rows=4)
    batch: list[int] = []
    next_id = 0
    for _ in range(400):
        op = rng.integers(4)
        if op == 0 or len(batch) < 10:  # join at the end, as a decode batch does
            for _ in range(int(rng.integers(1, 4))):
                seqs.add(next_id)
                batch = batch + [next_id]
                next_id += 1
        elif op == 1:  # a sequence leaves from anywhere (finished) and its row is freed
            gone = batch[int(rng.integers(len(batch)))]
            seqs.remove(gone)
            batch = [s for s in batch if s != gone]
        elif op == 2:  # a sequence leaves the batch but stays live (swapped out)
            batch = batch[:-1]
        else:  # a one-group lookup in between (an admission) leaves the batch's cache alone
            seqs.rows(batch[:2])
        assert np.array_equal(seqs.rows(batch), fresh_rows(seqs, batch))
        live = set(seqs.ids())
        assert all(seqs.id_of(seqs.row(s)) == s for s in live)
        probe = {int(s) for s in rng.integers(0, next_id + 2, 3)}
        assert seqs.all_live(probe) == (probe <= live)
        assert seqs.none_live(list(probe)) == probe.isdisjoint(live)


def test_a_removed_sequence_is_unknown_to_a_later_lookup():
    seqs = SeqRows(("length",))
    ids = list(range(12))
    for s in ids:
        seqs.add(s)
    seqs.rows(ids)
    seqs.remove(5)
    with pytest.raises(KeyError, match="sequence 5 is not live"):
        seqs.rows(ids)
