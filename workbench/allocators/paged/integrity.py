"""`check_integrity` of the paged strategies: every invariant recomputed from scratch (O(pool)).

It takes the strategy's parts, not the strategy, so that `paged` can import it (no import cycle).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged.tables import BlockTables
from workbench.intmath import cdiv


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def check_paged(t: BlockTables, *, max_model_len: int, refcount: np.ndarray, host_refcount: np.ndarray,
                free_ids: np.ndarray, host_free_ids: np.ndarray, cached_ids: np.ndarray, registered_ids: np.ndarray,
                written_slots: int, logical_slots: int, table_entries: int,
                state_ids: np.ndarray | None = None) -> None:
    """Raise AssertionError naming the first broken invariant. Pure. `refcount` int32 [num_blocks] and
    `host_refcount` int32 [num_host_blocks] are the holder counts; the id arrays are int32 block ids
    (free stack, host free stack, cached = evictable prefix blocks, registered prefix blocks); the
    counters are the strategy's running token_slots, logical_token_slots and table-entry counts; `state_ids` the
    blocks recurrent states and their checkpoints hold (docs/recurrent.md)."""
    bs = t.block_size
    num_blocks, num_host_blocks = refcount.shape[0], host_refcount.shape[0]
    seqs = t.seqs
    live = np.flatnonzero(seqs.live)
    lengths = seqs.column("length")[live]
    finals = seqs.column("final_len")[live]
    table_lengths = seqs.column("num_blocks")[live]
    _require(bool(np.all(lengths >= 1)), "a live sequence has no token")
    _require(bool(np.all(lengths <= finals)) and bool(np.all(finals <= max_model_len)),
             "length <= final_len <= max_model_len broken")
    _require(bool(np.all(table_lengths == cdiv(lengths, bs))), "a table length is not ceil(length / block_size)")
    _require(all(int(seqs.column("last_block")[r]) == int(t.blocks_of(r)[-1]) for r in live.tolist()),
             "a row's last_block is not its last table entry")

    device_rows = t.on_device_rows()
    host_rows = live[seqs.column("swapped")[live] == 1]
    for rows, pool in ((device_rows, num_blocks), (host_rows, num_host_blocks)):
        entries, _ = t.entries_of(rows)
        _require(bool(np.all((entries >= 0) & (entries < pool))), "a table entry is outside its pool")
        for r in rows.tolist():
            blocks = t.blocks_of(r)
            _require(np.unique(blocks).shape[0] == blocks.shape[0], f"row {r} holds a block twice")

    entries, fills = t.entries_of(device_rows)
    holders = np.bincount(entries, minlength=num_blocks)
    _require(bool(np.array_equal(holders, refcount)), "device refcounts differ from the holders' count")
    host_entries, _ = t.entries_of(host_rows)
    host_holders = np.bincount(host_entries, minlength=num_host_blocks)
    _require(bool(np.array_equal(host_holders, host_refcount)), "host refcounts differ from the holders' count")

    fill_min = np.full(num_blocks, bs + 1, dtype=np.int64)
    fill_max = np.full(num_blocks, -1, dtype=np.int64)
    np.minimum.at(fill_min, entries, fills)
    np.maximum.at(fill_max, entries, fills)
    held = holders > 0
    _require(bool(np.array_equal(fill_min[held], fill_max[held])), "holders of a block disagree on its fill")
    _require(bool(np.all(fill_max[registered_ids][held[registered_ids]] == bs)),
             "a registered prefix block is not full")
    _require(int(fill_max[held].sum()) == written_slots, "token_slots counter differs from recomputation")
    _require(int(lengths[seqs.column("swapped")[live] == 0].sum()) == logical_slots,
             "logical_token_slots counter differs from recomputation")
    _require(entries.shape[0] == table_entries, "block-table entry counter differs from recomputation")

    _require(np.unique(free_ids).shape[0] == free_ids.shape[0], "a block is on the free stack twice")
    state = np.zeros(num_blocks, dtype=np.int64)
    np.add.at(state, free_ids, 1)
    np.add.at(state, cached_ids, 1)
    if state_ids is not None:
        _require(not bool(np.any(held[state_ids])), "a recurrent state's block is in a block table")
        np.add.at(state, state_ids, 1)
    state += held
    _require(bool(np.all(state == 1)), "held, free, cached and state blocks are not a partition of the pool")

    host_state = np.zeros(num_host_blocks, dtype=np.int64)
    np.add.at(host_state, host_free_ids, 1)
    host_state += host_holders > 0
    _require(bool(np.all(host_state == 1)), "held and free host blocks are not a partition of the host pool")
