"""`check_integrity` of the paged strategies: every invariant recomputed from scratch (O(pool)).

It takes the strategy's parts, not the strategy, so that `paged` can import it (no import cycle). The
invariants are recounted in one compiled pass (`integrity_pass`): the tests run it after every operation of
their walks and every engine step.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged import integrity_pass as P
from workbench.allocators.paged.tables import BlockTables

NO_IDS = np.zeros(0, dtype=np.int64)


def first_repeating_segment(values: np.ndarray, sizes: np.ndarray, bound: int) -> int | None:
    """The first segment that holds a value twice, else None: `values` int [sum(sizes)] are segments laid end
    to end, `sizes` their lengths, every value in [0, bound). One sort over every segment's values, each
    tagged with its segment (a row's block table, a sequence's blocks in a layer group)."""
    tagged = np.sort(np.repeat(np.arange(sizes.shape[0], dtype=np.int64), sizes) * bound + values)
    repeated = np.flatnonzero(tagged[1:] == tagged[:-1])
    return None if not repeated.shape[0] else int(tagged[repeated[0]] // bound)


_WORDS = {
    P.NO_TOKEN: "a live sequence has no token",
    P.LENGTH_ORDER: "length <= final_len <= max_model_len broken",
    P.TABLE_LENGTH: "a table length is not ceil(length / block_size)",
    P.TABLE_WIDTH: "a row has more table entries than the tables hold",
    P.LAST_BLOCK: "a row's last_block is not its last table entry",
    P.OUTSIDE: "a table entry is outside its pool",
    P.DEVICE_REFCOUNT: "device refcounts differ from the holders' count",
    P.HOST_REFCOUNT: "host refcounts differ from the holders' count",
    P.FILL_DISAGREE: "holders of a block disagree on its fill",
    P.REGISTERED_OUTSIDE: "the registered prefix blocks: a block id outside the pool",
    P.REGISTERED_NOT_FULL: "a registered prefix block is not full",
    P.WRITTEN: "token_slots counter differs from recomputation",
    P.LOGICAL: "logical_token_slots counter differs from recomputation",
    P.ENTRIES: "block-table entry counter differs from recomputation",
    P.FREE_OUTSIDE: "the free stack: a block id outside the pool",
    P.FREE_TWICE: "a block is on the free stack twice",
    P.CACHED_OUTSIDE: "the cached blocks: a block id outside the pool",
    P.STATE_OUTSIDE: "the state blocks: a block id outside the pool",
    P.STATE_IN_TABLE: "a recurrent state's block is in a block table",
    P.PARTITION: "held, free, cached and state blocks are not a partition of the pool",
    P.HOST_FREE_OUTSIDE: "the host free stack: a block id outside the pool",
    P.HOST_PARTITION: "held and free host blocks are not a partition of the host pool",
}


def check_paged(t: BlockTables, *, max_model_len: int, refcount: np.ndarray, host_refcount: np.ndarray,
                free_ids: np.ndarray, host_free_ids: np.ndarray, cached_ids: np.ndarray, registered_ids: np.ndarray,
                written_slots: int, logical_slots: int, table_entries: int,
                state_ids: np.ndarray | None = None) -> None:
    """Raise AssertionError naming the first broken invariant. Pure. `refcount` int32 [num_blocks] and
    `host_refcount` int32 [num_host_blocks] are the holder counts; the id arrays are int32 block ids
    (free stack, host free stack, cached = evictable prefix blocks, registered prefix blocks); the
    counters are the strategy's running token_slots, logical_token_slots and table-entry counts; `state_ids` the
    blocks recurrent states and their checkpoints hold (docs/recurrent.md). The invariants, in the order they
    are checked: every live row has 1 <= length <= final_len <= max_model_len, ceil(length / block_size) table
    entries and its last entry as last_block; entries lie in their pool (a swapped-out row's in the host pool)
    and no row holds a block twice; the refcounts are the holders' counts; a block's holders agree on its fill
    (block_size, or a row's length past its full blocks) and a held registered block is full; the counters are
    the recounted written slots, logical slots of rows on the device and device entries; held, free, cached and
    state blocks partition the pool, and held and free host blocks the host pool."""
    c = t.seqs.columns
    ids = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # one compiled signature whatever the list's dtype
    code, row = P.check_pool(t.seqs.live, c["length"], c["final_len"], c["num_blocks"], c["last_block"],
                             c["swapped"], t._table, t.block_size, max_model_len, refcount, host_refcount,
                             ids(free_ids), ids(host_free_ids), ids(cached_ids), ids(registered_ids),
                             ids(NO_IDS if state_ids is None else state_ids), written_slots, logical_slots,
                             table_entries)
    if code == P.TWICE:
        raise AssertionError(f"row {row} holds a block twice")
    if code != P.OK:
        raise AssertionError(_WORDS[code])
