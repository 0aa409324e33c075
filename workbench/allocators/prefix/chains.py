"""Per-sequence chain keys: the key of each full block a sequence holds, as it grows.

A prompt's full blocks get their keys in one vectorized pass (`prefix.keys.block_keys`). A block
filled token by token during decode gets the same key from the sequence's running state: the key of
its last full block (`chain_key`) and the term sum of its partial block (`tail_sum`), advanced by
one compiled pass per decode step (`prefix.loops.append_terms`). So a later prompt holding the same
tokens computes the same key and hits the block (a multi-turn prompt hits the previous answer). A
sequence that appends without token ids has unknown content from then on (`known` False) and
yields no more keys. Any prefix index keyed by chain keys shares this state instead of copying it.

State per row of the strategy's `SeqRows` (set whenever a row gets a sequence: `start`, `fork`).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.prefix.keys import (
    CHAIN_BASE,
    block_keys,
    chain_keys,
    position_salt,
    token_terms,
)
from workbench.allocators.prefix.loops import append_terms, start_rows


class SeqChains:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._salt = position_salt(block_size)
        self._chain_key = np.zeros(0, dtype=np.uint64)  # [rows] key of the last full block (0: none)
        self._tail_sum = np.zeros(0, dtype=np.uint64)  # [rows] term sum of the partial last block's tokens
        self._known = np.zeros(0, dtype=bool)  # [rows] every token id of the sequence is known

    def prompt_keys(self, token_ids: np.ndarray) -> np.ndarray:
        """Pure. Chain keys of the prompt's full blocks, uint64 [num_tokens // block_size]."""
        return block_keys(token_ids, self.block_size)

    def start(self, rows: np.ndarray, token_ids: np.ndarray, keys: np.ndarray, capacity_rows: int) -> None:
        """Mutates. These rows now hold `token_ids` (int32 [n], whose full blocks' keys are `keys`)."""
        self.fit(capacity_rows)
        last_key = keys[-1] if keys.shape[0] else np.uint64(0)
        start_rows(rows, token_ids, self._salt, last_key, self._chain_key, self._tail_sum, self._known)

    def fork(self, parent: int, child: int, capacity_rows: int) -> None:
        """Mutates. The child row continues the parent row's chain (same tokens)."""
        self.fit(capacity_rows)
        self._chain_key[child] = self._chain_key[parent]
        self._tail_sum[child] = self._tail_sum[parent]
        self._known[child] = self._known[parent]

    def forget(self, rows: np.ndarray) -> None:
        """Mutates. These rows appended tokens of unknown ids: they yield no more keys."""
        self._known[rows] = False

    def extend(self, rows: np.ndarray, length: int, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mutates. Rows of one shared chain (a group's prompt being prefilled, int64 [n]) holding
        `length` tokens append `token_ids` (int32 [k]). Returns the parent keys and keys of the blocks
        this fills, uint64 [num_filled] each (none when the rows' token ids are unknown)."""
        bs, k, row = self.block_size, token_ids.shape[0], rows[0]
        positions = length + np.arange(k)
        terms = token_terms(token_ids, positions % bs, bs)  # [k]
        bounds = np.concatenate([[0], np.flatnonzero(positions[1:] % bs == 0) + 1])  # where each block begins
        sums = np.add.reduceat(terms, bounds)  # [blocks touched] term sums of the chunk's part of each
        sums[:1] += self._tail_sum[row:row + 1]  # the partial block it continues (0 when it starts a block)
        num_filled = (length + k) // bs - length // bs
        keys = chain_keys(self._chain_key[row], sums[:num_filled])
        parents = np.concatenate([self._chain_key[row:row + 1], keys])[:num_filled]  # each block's predecessor
        if num_filled:
            self._chain_key[rows] = keys[-1]
        self._tail_sum[rows] = sums[-1] if (length + k) % bs else np.uint64(0)
        if not self._known[row]:
            return keys[:0], keys[:0]
        return parents, keys

    def advance(self, rows: np.ndarray, lengths: np.ndarray, token_ids: np.ndarray):
        """Mutates. Each row of `rows` (int64 [n]) just wrote `token_ids[i]` at position lengths[row] - 1
        (`lengths` int64 [capacity_rows]). Returns the known rows whose block became full, int64 [k],
        their blocks' parent keys and keys, uint64 [k] each."""
        filled_rows = np.empty(rows.shape[0], dtype=np.int64)
        filled_parents = np.empty(rows.shape[0], dtype=np.uint64)
        filled_keys = np.empty(rows.shape[0], dtype=np.uint64)
        n = append_terms(rows, lengths, token_ids, self._salt, CHAIN_BASE, self._chain_key, self._tail_sum,
                         self._known, filled_rows, filled_parents, filled_keys)
        return filled_rows[:n], filled_parents[:n], filled_keys[:n]

    def compiled_view(self) -> tuple[np.ndarray, ...]:
        """(position salt, chain key, tail sum, known): what `advance` hands `append_terms`, changed in place."""
        return self._salt, self._chain_key, self._tail_sum, self._known

    def fit(self, capacity_rows: int) -> None:
        """Mutates. State for rows below `capacity_rows` (new rows start empty)."""
        grow = capacity_rows - self._known.shape[0]
        if grow > 0:
            self._chain_key = np.concatenate([self._chain_key, np.zeros(grow, dtype=np.uint64)])
            self._tail_sum = np.concatenate([self._tail_sum, np.zeros(grow, dtype=np.uint64)])
            self._known = np.concatenate([self._known, np.zeros(grow, dtype=bool)])
