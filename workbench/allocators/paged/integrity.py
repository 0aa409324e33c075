"""`check_integrity` of the paged strategies: every invariant recomputed from scratch (O(pool)).

It takes the strategy's parts, not the strategy, so that `paged` can import it (no import cycle). Each
invariant is one array pass over every row or block, not a loop over the rows: the tests run it after every
operation of their walks and every engine step.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged.tables import BlockTables
from workbench.intmath import cdiv


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def _counts(ids: np.ndarray, size: int, what: str) -> np.ndarray:
    """How often each block id occurs in `ids` (`what`, of a pool of `size` blocks), int64 [size]."""
    _require(not ids.shape[0] or (int(ids.min()) >= 0 and int(ids.max()) < size),
             f"{what}: a block id outside the pool")
    return np.bincount(ids, minlength=size).astype(np.int64, copy=False)


def first_repeating_segment(values: np.ndarray, sizes: np.ndarray, bound: int) -> int | None:
    """The first segment that holds a value twice, else None: `values` int [sum(sizes)] are segments laid end
    to end, `sizes` their lengths, every value in [0, bound). One sort over every segment's values, each
    tagged with its segment (a row's block table, a sequence's blocks in a layer group)."""
    tagged = np.sort(np.repeat(np.arange(sizes.shape[0], dtype=np.int64), sizes) * bound + values)
    repeated = np.flatnonzero(tagged[1:] == tagged[:-1])
    return None if not repeated.shape[0] else int(tagged[repeated[0]] // bound)


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
    live_entries, live_fills, live_indptr = t.entries_of(live)  # each live row has an entry (checked above)
    _require(bool(np.array_equal(seqs.column("last_block")[live], live_entries[live_indptr[1:] - 1])),
             "a row's last_block is not its last table entry")

    # a swapped-out row's entries are host blocks, the others' device blocks
    swapped = seqs.column("swapped")[live] == 1
    on_host = np.repeat(swapped, table_lengths)
    entries, fills, host_entries = live_entries[~on_host], live_fills[~on_host], live_entries[on_host]
    _require(bool(np.all((entries >= 0) & (entries < num_blocks)))
             and bool(np.all((host_entries >= 0) & (host_entries < num_host_blocks))),
             "a table entry is outside its pool")
    twice = first_repeating_segment(live_entries, table_lengths, max(num_blocks, num_host_blocks))
    _require(twice is None, f"row {None if twice is None else live[twice]} holds a block twice")

    holders = _counts(entries, num_blocks, "the device tables")
    _require(bool(np.array_equal(holders, refcount)), "device refcounts differ from the holders' count")
    host_holders = _counts(host_entries, num_host_blocks, "the host tables")
    _require(bool(np.array_equal(host_holders, host_refcount)), "host refcounts differ from the holders' count")

    # one fill per block: any holder's (the last one written), which every holder must agree with
    fill = np.full(num_blocks, -1, dtype=np.int64)
    fill[entries] = fills
    held = holders > 0
    _require(bool(np.array_equal(fill[entries], fills)), "holders of a block disagree on its fill")
    _require(bool(np.all(fill[registered_ids][held[registered_ids]] == bs)), "a registered prefix block is not full")
    _require(int(fill[held].sum()) == written_slots, "token_slots counter differs from recomputation")
    _require(int(lengths[~swapped].sum()) == logical_slots, "logical_token_slots counter differs from recomputation")
    _require(entries.shape[0] == table_entries, "block-table entry counter differs from recomputation")

    state = _counts(free_ids, num_blocks, "the free stack")
    _require(bool(np.all(state <= 1)), "a block is on the free stack twice")
    state += _counts(cached_ids, num_blocks, "the cached blocks")
    if state_ids is not None:
        _require(not bool(np.any(held[state_ids])), "a recurrent state's block is in a block table")
        state += _counts(state_ids, num_blocks, "the state blocks")
    state += held
    _require(bool(np.all(state == 1)), "held, free, cached and state blocks are not a partition of the pool")

    host_state = _counts(host_free_ids, num_host_blocks, "the host free stack")
    host_state += host_holders > 0
    _require(bool(np.all(host_state == 1)), "held and free host blocks are not a partition of the host pool")
