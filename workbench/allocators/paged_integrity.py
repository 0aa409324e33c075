"""`check_integrity` of the paged strategies: every invariant recomputed from scratch (O(pool))."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workbench.allocators.paged import PagedStrategy


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def check_paged(s: PagedStrategy) -> None:
    """Raise AssertionError naming the first broken invariant. Pure."""
    t, bs = s.tables, s.block_size
    seqs = t.seqs
    live = np.flatnonzero(seqs.live)
    lengths = seqs.column("length")[live]
    finals = seqs.column("final_len")[live]
    num_blocks = seqs.column("num_blocks")[live]
    _require(bool(np.all(lengths >= 1)), "a live sequence has no token")
    _require(bool(np.all(lengths <= finals)) and bool(np.all(finals <= s.max_model_len)),
             "length <= final_len <= max_model_len broken")
    _require(bool(np.all(num_blocks == -(-lengths // bs))), "a table length is not ceil(length / block_size)")

    device_rows = t.on_device_rows()
    host_rows = live[seqs.column("swapped")[live] == 1]
    for rows, pool in ((device_rows, s.num_blocks), (host_rows, s._host_refcount.shape[0])):
        entries, _ = t.entries_of(rows)
        _require(bool(np.all((entries >= 0) & (entries < pool))), "a table entry is outside its pool")
        for r in rows.tolist():
            blocks = t.blocks_of(r)
            _require(np.unique(blocks).shape[0] == blocks.shape[0], f"row {r} holds a block twice")

    entries, fills = t.entries_of(device_rows)
    refcount = np.bincount(entries, minlength=s.num_blocks)
    _require(bool(np.array_equal(refcount, s._refcount)), "device refcounts differ from the holders' count")
    host_entries, _ = t.entries_of(host_rows)
    host_refcount = np.bincount(host_entries, minlength=s._host_refcount.shape[0])
    _require(bool(np.array_equal(host_refcount, s._host_refcount)), "host refcounts differ from the holders' count")

    fill_min = np.full(s.num_blocks, bs + 1, dtype=np.int64)
    fill_max = np.full(s.num_blocks, -1, dtype=np.int64)
    np.minimum.at(fill_min, entries, fills)
    np.maximum.at(fill_max, entries, fills)
    held = refcount > 0
    _require(bool(np.array_equal(fill_min[held], fill_max[held])), "holders of a block disagree on its fill")
    registered = s.registered_block_ids()
    _require(bool(np.all(fill_max[registered][held[registered]] == bs)), "a registered prefix block is not full")
    _require(int(fill_max[held].sum()) == s._written_slots, "token_slots counter differs from recomputation")
    _require(int(lengths[seqs.column("swapped")[live] == 0].sum()) == s._logical_slots,
             "logical_token_slots counter differs from recomputation")
    _require(entries.shape[0] == s._table_entries, "block-table entry counter differs from recomputation")

    free = s._free.ids()
    cached = s.cached_block_ids()
    _require(np.unique(free).shape[0] == free.shape[0], "a block is on the free stack twice")
    state = np.zeros(s.num_blocks, dtype=np.int64)
    np.add.at(state, free, 1)
    np.add.at(state, cached, 1)
    state += held
    _require(bool(np.all(state == 1)), "held, free and cached blocks are not a partition of the pool")

    host_free = s._host_free.ids()
    host_state = np.zeros(s._host_refcount.shape[0], dtype=np.int64)
    np.add.at(host_state, host_free, 1)
    host_state += host_refcount > 0
    _require(bool(np.all(host_state == 1)), "held and free host blocks are not a partition of the host pool")
    s.check_cache_index()
