"""The swap verbs of `PagedStrategy` (allocators.paged.strategy): a preempted group's blocks go to a
host pool of `swap_slots // block_size` blocks and come back to new device blocks.

A mixin, because swapping reads and writes the strategy's own state: its block tables, device and
host reference counts, free stacks and running counters. A block shared inside the group moves once.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged import pool_counts
from workbench.allocators.values import SwapResult


class PagedSwap:
    """Swap-out and swap-in of whole groups; mixed into PagedStrategy, whose state it mutates."""

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        rows = self.tables.seqs.rows(seq_ids)
        self._check_on_device(rows)
        return np.unique(self.tables.entries_of(rows)[0]).shape[0] <= self._host_free.size

    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each distinct block of the group moves to one host block (shared blocks once);
        device blocks no sequence outside the group holds are released."""
        t = self.tables
        rows = t.seqs.rows(seq_ids)
        self._check_on_device(rows)
        entries, fills, _ = t.entries_of(rows)
        blocks, first, inverse, counts = _distinct_in_order(entries)
        host = self._host_free.pop(blocks.shape[0])
        self._host_refcount[host] += counts
        t.replace_entries(rows, host[inverse])
        t.swapped[rows] = True
        self._refcount[blocks] -= counts
        released = self._refcount[blocks] == 0
        pool_counts.released(self.counts, fills[first][released].sum(), t.seqs.column("length")[rows].sum(),
                             entries.shape[0])
        self._release(blocks[released])
        self.swapped_out_blocks += blocks.shape[0]
        return SwapResult(moves=np.stack([blocks, host], axis=1).astype(np.int32))

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        rows = self.tables.seqs.rows(seq_ids)
        self._check_swapped(rows)
        return np.unique(self.tables.entries_of(rows)[0]).shape[0] <= self.num_allocatable_blocks()

    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each distinct host block of the group comes back to one new device block."""
        t = self.tables
        rows = t.seqs.rows(seq_ids)
        self._check_swapped(rows)
        entries, fills, _ = t.entries_of(rows)
        host, first, inverse, counts = _distinct_in_order(entries)
        if host.shape[0] > self.num_allocatable_blocks():
            raise RuntimeError(f"cannot swap in: needs {host.shape[0]} blocks, {self.num_allocatable_blocks()} "
                               "allocatable")
        device = self._take(host.shape[0])
        self._refcount[device] = counts
        t.replace_entries(rows, device[inverse])
        t.swapped[rows] = False
        self._host_refcount[host] -= counts
        self._host_free.push(host[self._host_refcount[host] == 0])
        pool_counts.restored(self.counts, fills[first].sum(), t.seqs.column("length")[rows].sum(), entries.shape[0])
        self.swapped_in_blocks += host.shape[0]
        return SwapResult(moves=np.stack([host, device], axis=1).astype(np.int32))

    def _check_on_device(self, rows: np.ndarray) -> None:
        _check_distinct(rows)
        if self.tables.swapped[rows].any():
            raise ValueError("a sequence of the batch is swapped out")

    def _check_swapped(self, rows: np.ndarray) -> None:
        _check_distinct(rows)
        if not self.tables.swapped[rows].all():
            raise ValueError("a sequence of the batch is not swapped out")


def _check_distinct(rows: np.ndarray) -> None:
    if np.unique(rows).shape[0] != rows.shape[0]:
        raise ValueError("a sequence id repeats in the group")


def _distinct_in_order(entries: np.ndarray):
    """Distinct values in first-occurrence order, int32 [k]; each one's first index [k]; the inverse
    map [len(entries)]; and each one's count [k]."""
    uniq, first, inverse, counts = np.unique(entries, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return uniq[order].astype(np.int32), first[order], rank[inverse], counts[order].astype(np.int32)
