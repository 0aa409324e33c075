"""The per-step loops of the paged strategies, compiled with Numba.

A decode step touches every running sequence, so its bookkeeping runs as one compiled pass over the
batch instead of a few dozen numpy calls (each ~1 µs of fixed cost, which dominates at 256
sequences). The loops are plain and sequential on purpose: their order *is* the semantics (the
k-th writer into a shared block copies iff k < refcount, so the last holder writes in place).

Arrays (shared by every function; the caller owns and passes them):
  table      int32 [capacity_rows, capacity_cols]  block table of each row
  length     int64 [capacity_rows]  tokens held
  num_blocks int64 [capacity_rows]  entries of the row's table in use
  last_block int64 [capacity_rows]  the row's last table entry (table[r, num_blocks[r] - 1]), kept beside it
  refcount   int32 [num_blocks]     holders among on-device sequences
  scratch    int64 [num_blocks]     all zero between calls (per-block tallies inside one call)
  row_mark   int64 [capacity_rows]  all zero between calls (rows seen inside one call)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.allocators.batch_check import row_status
from workbench.allocators.paged.block_stack import pop_blocks

# statuses of a compiled decode append (`decode_append`, `prefix.decode_append`); a negative one is
# `batch_check`'s error
APPENDED, NO_ROOM, WIDEN = 0, 1, 2


@njit(cache=True)
def count_append(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size, scratch, row_mark,
                 sole_holders, check_rows):
    """Pure (scratch and row_mark are restored). (blocks the append takes, widest table after it),
    or `batch_check`'s (negative status, index of the offending sequence in the batch). With `check_rows`, each
    row is checked (`row_status`) in the pass that counts it; a caller whose batch is its own rows, each joined
    once, never swapped out and gone at its final length (the compiled step loop), passes False. The per-block
    tallies of shared last blocks are skipped while no block of the batch is shared; `sole_holders` True says no
    held block has two holders (the caller knows it exactly), and no last block's holders are looked up."""
    num_new = 0
    widest = 0
    shared = False  # a writer into a shared last block was tallied in scratch
    status = 0
    seen = rows.shape[0]  # rows [0, seen) were checked and marked
    for i in range(rows.shape[0]):
        r = rows[i]
        if check_rows:
            status = row_status(row_mark[r], swapped[r], length[r], final_len[r])
            if status != 0:
                seen = i
                break
            row_mark[r] = 1
        nb = num_blocks[r]
        if length[r] == nb * block_size:  # the last block is full (a table holds ceil(length / block_size))
            num_new += 1
            widest = max(widest, nb + 1)
        else:
            widest = max(widest, nb)
            if not sole_holders:
                b = last_block[r]
                if refcount[b] > 1:  # this writer is the scratch[b]-th into block b; a sole holder never copies
                    scratch[b] += 1
                    shared = True
                    if scratch[b] < refcount[b]:
                        num_new += 1  # a copy: some other holder is still there
    if check_rows or shared:
        for i in range(seen):
            r = rows[i]
            row_mark[r] = 0
            if shared:
                scratch[last_block[r]] = 0
    if status != 0:
        return status, seen
    return num_new, widest


@njit(cache=True)
def apply_append(rows, length, num_blocks, last_block, table, refcount, block_size, new_blocks, slots, copies,
                 sole_holders):
    """Mutates table, length, num_blocks, last_block, refcount, and fills slots int64 [num_seqs] (unless it is
    empty: a caller without a kernel) and the first rows of copies int32 [>= num_copies, 2]. `new_blocks` must
    hold exactly what count_append counted (with the same `sole_holders`), in the order they are used. Returns
    (number of copies, slots copied, tables grown)."""
    used = 0
    num_copies = 0
    copied_slots = 0
    grown = 0
    want_slots = slots.shape[0] > 0
    for i in range(rows.shape[0]):
        r = rows[i]
        pos = length[r]
        nb = num_blocks[r]
        if pos == nb * block_size:  # the last block is full: a new one at entry nb
            offset = 0
            b = new_blocks[used]
            used += 1
            table[r, nb] = b
            last_block[r] = b
            refcount[b] = 1
            num_blocks[r] = nb + 1
            grown += 1
        elif sole_holders and not want_slots:  # the row writes into its own last block; nothing else to do
            length[r] = pos + 1
            continue
        else:
            offset = pos - (nb - 1) * block_size
            b = last_block[r]  # = table[r, nb - 1]
            if not sole_holders and refcount[b] > 1:  # copy-on-write: the writer takes a private copy
                dst = new_blocks[used]
                used += 1
                refcount[b] -= 1
                refcount[dst] = 1
                table[r, nb - 1] = dst
                last_block[r] = dst
                copies[num_copies, 0] = b
                copies[num_copies, 1] = dst
                num_copies += 1
                copied_slots += offset
                b = dst
        if want_slots:
            slots[i] = np.int64(b) * block_size + offset
        length[r] = pos + 1
    return num_copies, copied_slots, grown


@njit(cache=True)
def gather_tables(rows, length, num_blocks, table, block_size):
    """Pure. FlashInfer's CSR page table of these rows: (kv_indptr int32 [n + 1], kv_indices int32
    [nnz], kv_last_page_len int32 [n])."""
    n = rows.shape[0]
    indptr = np.empty(n + 1, dtype=np.int32)
    indptr[0] = 0
    for i in range(n):
        indptr[i + 1] = indptr[i] + num_blocks[rows[i]]
    indices = np.empty(indptr[n], dtype=np.int32)
    last_page_len = np.empty(n, dtype=np.int32)
    for i in range(n):
        r = rows[i]
        nb = num_blocks[r]
        at = indptr[i]
        for j in range(nb):
            indices[at + j] = table[r, j]
        last_page_len[i] = length[r] - (nb - 1) * block_size
    return indptr, indices, last_page_len


@njit(cache=True)
def release_row(row, length, num_blocks, table, refcount, block_size, released):
    """Mutates refcount: drop the row's hold on each of its blocks. Fills `released` (int32
    [>= num_blocks[row]]) with the blocks that reached refcount 0, head first. Returns (number
    released, written slots they held)."""
    nb = num_blocks[row]
    n = 0
    written = 0
    for j in range(nb):
        b = table[row, j]
        refcount[b] -= 1
        if refcount[b] == 0:
            released[n] = b
            n += 1
            written += block_size if j < nb - 1 else length[row] - (nb - 1) * block_size
    return n, written


@njit(cache=True)
def reserved_slots(live, swapped, length, final_len, num_blocks, last_block, refcount, block_size, scratch,
                   sole_holders):
    """Pure (scratch is restored). Unwritten slots of held blocks that some holder will write, over the
    on-device rows (`live` bool [capacity_rows] and not `swapped`): only last blocks can be partial; a
    shared one counts once, with its furthest-reaching holder. `sole_holders`: `count_append`'s."""
    total = 0
    shared = False  # a last block with other holders was seen: tallied in scratch, added in a second pass
    for r in range(live.shape[0]):
        if not live[r] or swapped[r] != 0:
            continue
        start = (num_blocks[r] - 1) * block_size
        gap = min(final_len[r] - start, block_size) - (length[r] - start)
        if sole_holders:
            total += gap
            continue
        b = last_block[r]
        if refcount[b] == 1:
            total += gap
        else:
            scratch[b] = max(scratch[b], gap + 1)  # +1: zero marks "not yet seen"
            shared = True
    if not shared:
        return total
    for r in range(live.shape[0]):
        if not live[r] or swapped[r] != 0:
            continue
        b = last_block[r]
        if scratch[b] > 0:
            total += scratch[b] - 1
            scratch[b] = 0
    return total


@njit(cache=True)
def decode_append(rows, length, final_len, num_blocks, swapped, last_block, table, refcount, block_size, scratch,
                  row_mark, free_ids, free_size, slots, copies, sole_holders, check_rows):
    """A decode step's append in one call: `count_append`, then, when the free stack (`free_ids[:free_size]`,
    top last) holds the blocks and the table is wide enough, `apply_append` with them in the stack's pop
    order (`sole_holders`, `check_rows`: `count_append`'s). Returns (status, x, y, z, grown): status < 0:
    `check_batch`'s error, x the offending index; NO_ROOM: x blocks needed, fewer free; WIDEN: the table needs x
    columns (nothing changed in those three); APPENDED: appended, taking x blocks, making y copies of z slots in
    all, the tables `grown` entries longer."""
    num_new, widest = count_append(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size,
                                   scratch, row_mark, sole_holders, check_rows)
    if num_new < 0:
        return num_new, widest, 0, 0, 0
    if num_new > free_size:
        return NO_ROOM, num_new, 0, 0, 0
    if widest > table.shape[1]:
        return WIDEN, widest, 0, 0, 0
    popped = pop_blocks(free_ids, free_size, num_new)
    num_copies, copied_slots, grown = apply_append(rows, length, num_blocks, last_block, table, refcount, block_size,
                                                   popped, slots, copies, sole_holders)
    return APPENDED, num_new, num_copies, copied_slots, grown


@njit(cache=True)
def fill_row(row, blocks, tokens, final, table, length, final_len, num_blocks, last_block):
    """A new sequence's row (`BlockTables.add`): its table holds `blocks` (the table is wide enough), it holds
    `tokens` tokens and will hold `final` when it finishes."""
    n = blocks.shape[0]
    for j in range(n):
        table[row, j] = blocks[j]
    length[row] = tokens
    final_len[row] = final
    num_blocks[row] = n
    if n:
        last_block[row] = blocks[n - 1]


@njit(cache=True)
def last_two_blocks(rows, table, num_blocks, last, before):
    """Writes each row's last table entry into `last` and the entry before it into `before` (-1 where
    the row has one block); `rows` int64 [k], the outputs int32 [k]."""
    for i in range(rows.shape[0]):
        r = rows[i]
        n = num_blocks[r]
        last[i] = table[r, n - 1]
        before[i] = table[r, n - 2] if n >= 2 else -1
