"""The prefix cache of a hybrid pool: one hash index over every layer group, vLLM v1's hit rule (docs/hybrid.md).

Keys: a full logical block of a sequence has one chain key (`prefix.chains`), the same in every
group; each group registers its own entry under that key salted with the group (vLLM v1 keys its
block pool by (block hash, group id)), so the groups share one index and one eviction order, as
vLLM's groups share one free queue. The index sees an entry by its unit-0 block (`head`); the other
units of the entry are held, cached and evicted with it (vLLM evicts a group's blocks one by one,
but they enter its free queue side by side).

Hit rule (vLLM v1 `HybridKVCacheCoordinator.find_longest_cache_hit`): a full-attention group takes
the leading run of cached blocks; a sliding-window group of window W needs, at a hit of n blocks,
only its blocks [n − cdiv(W − 1, B), n) (the next query reads the last W − 1 tokens), found by a
search from the right (`SlidingWindowManager.find_longest_cache_hit`, its fallback included: with
no run that long, the leading run). Full groups go first; the candidate shrinks until every group
accepts it. Blocks a window group releases keep their keys and go to the evictable end of the
cache, so a later prompt can still hit them.

Per-sequence chain state (`SeqChains`) lives in the pool's rows (its `SeqRows`, whose length column the
pool keeps), so decode-filled blocks are registered too (a multi-turn prompt hits the previous answer in
every group).
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

from workbench.allocators.paged.hybrid_tables import GroupTables
from workbench.allocators.prefix.chains import SeqChains
from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.seq_rows import SeqRows
from workbench.intmath import cdiv
from workbench.splitmix import mix, mix64

Entry = np.ndarray  # int32 [units]: one logical block of one group, its unit-0 block first


class HybridPrefixCache:
    def __init__(self, index: HashPrefixIndex, block_size: int, groups: list[GroupTables], seqs: SeqRows) -> None:
        """`seqs`: the pool's rows; a sequence's chain state is kept in its row."""
        self.index = index
        self.block_size = block_size
        self.groups = groups
        self._salt = mix64(np.arange(1, len(groups) + 1, dtype=np.uint64))  # uint64 [num_groups]
        self.entry_of: dict[int, Entry] = {}  # registered head -> its entry
        self._group_of = np.zeros(0, dtype=np.int64)  # [num_blocks] a registered head's group, -1: none
        self.cached_blocks = 0  # pool blocks of evictable entries (every unit)
        self._chains = SeqChains(block_size)
        self.seqs = seqs

    def salted(self, keys: np.ndarray, group: int) -> np.ndarray:
        """Group `group`'s keys for chain keys `keys` (uint64 [k]); 0 (no parent) stays 0. Pure."""
        keys = np.asarray(keys, dtype=np.uint64)
        salted = np.empty(keys.shape[0], dtype=np.uint64)
        _salt_into(keys, self._salt[group], salted)
        return salted

    # -- lookup ------------------------------------------------------------------------------------

    def find_hit(self, keys: np.ndarray, max_blocks: int) -> tuple[int, list[list[Entry]]]:
        """Pure. The hit in logical blocks, n <= max_blocks, and per group the cached entries a sequence
        holds from it: blocks [skip, n) of the group (skip = 0 for full attention)."""
        order = sorted(range(len(self.groups)), key=lambda gi: self.groups[gi].window_tokens is not None)
        full_runs: dict[int, np.ndarray] = {}  # a full group's leading run, looked up once
        window_runs: dict[int, tuple[int, list[int]]] = {}  # last scan: (hit, heads of [hit - len, hit))
        hit = max_blocks
        while True:
            candidate = hit
            for gi in order:
                g = self.groups[gi]
                if g.window_tokens is None:
                    if gi not in full_runs:
                        full_runs[gi] = self.index.lookup(self.salted(keys, gi), candidate)
                    candidate = min(candidate, full_runs[gi].shape[0])
                else:
                    window_runs[gi] = self._window_hit(self.salted(keys, gi), candidate,
                                                       cdiv(g.window_tokens - 1, self.block_size))
                    candidate = window_runs[gi][0]
            if candidate >= hit:
                break
            hit = candidate
        held = []  # per group: the hit entries its sequences hold
        for gi, g in enumerate(self.groups):
            skip = g.dead_before(hit * self.block_size)  # the first query (at the hit) reads none before it
            if g.window_tokens is None:
                heads = full_runs[gi][skip:hit].tolist()
            else:
                end, run = window_runs[gi]  # run: heads of blocks [end - len(run), end), covering [skip, end)
                assert end == hit and len(run) >= hit - skip, "a window group's last scan disagrees with the hit"
                heads = run[len(run) - (hit - skip):] if hit > skip else []
            held.append([self.entry_of[h] for h in heads])
        return hit, held

    def _window_hit(self, keys: np.ndarray, max_blocks: int, contiguous: int) -> tuple[int, list[int]]:
        """vLLM v1's sliding-window search, right to left: the first run of `contiguous` cached blocks
        ends the hit; without one, the leading run. Returns (hit, heads of the run's blocks in order)."""
        run: list[int] = []  # heads of the current run, rightmost first
        for i in range(max_blocks - 1, -1, -1):
            head = self.index.block_of(int(keys[i]))
            if head < 0:
                run = []
                continue
            run.append(head)
            if len(run) >= contiguous:
                return i + len(run), run[::-1]
        return len(run), run[::-1]

    # -- registration and release --------------------------------------------------------------------

    def register(self, group: int, keys: np.ndarray, parents: np.ndarray, entries: list[Entry],
                 before: list[Entry | None]) -> None:
        """Mutates. Full blocks of one group (`entries`, held) under chain keys `keys` with parent keys
        `parents` (uint64 [k] each; 0: none); `before[i]` is the table entry preceding entries[i]."""
        if not entries:
            return
        units = self.groups[group].units
        parent_heads = np.full(len(before), -1, dtype=np.int32)  # [k] -1: no entry before
        known = [i for i, b in enumerate(before) if b is not None]
        if known:
            parent_heads[known] = np.concatenate([before[i] for i in known])[::units]
        self._register_heads(group, keys, parents, entries, np.concatenate(entries)[::units], parent_heads)

    def _register_heads(self, group: int, keys: np.ndarray, parents: np.ndarray, entries: list[Entry],
                        heads: np.ndarray, parent_heads: np.ndarray) -> None:
        """Mutates. `register`, given the entries' unit-0 blocks and those of the entries before them
        (int32 [k] each; -1: none)."""
        self.index.insert(self.salted(parents, group), self.salted(keys, group), heads, parent_heads)
        self.entry_of.update(zip(heads.tolist(), entries, strict=True))
        if heads.max() >= self._group_of.shape[0]:
            grow = max(int(heads.max()) + 1, 2 * self._group_of.shape[0]) - self._group_of.shape[0]
            self._group_of = np.concatenate([self._group_of, np.full(grow, -1, dtype=np.int64)])
        self._group_of[heads] = group

    def register_prompt(self, seq_ids: list[int], token_ids: np.ndarray, keys: np.ndarray, num_hit: int) -> None:
        """Mutates. Sequences just admitted hold `token_ids` (int32 [n]), keyed `keys` (uint64 [n // B]):
        each group registers the full blocks after the hit (those are held, fresh)."""
        parents = np.zeros_like(keys)  # [num_full]: each block's predecessor's key, 0 before the first
        parents[1:] = keys[:-1]
        for gi, g in enumerate(self.groups):
            table = g.entries[seq_ids[0]]
            entries = table[num_hit:keys.shape[0]]
            if not entries:
                continue
            heads = np.concatenate(entries)[::g.units]  # [k] unit 0 of each
            parent_heads = np.empty_like(heads)  # [k] each entry's predecessor in the table: the one before
            parent_heads[1:] = heads[:-1]
            first = table[num_hit - 1] if num_hit else None  # None also where a window released it
            parent_heads[0] = -1 if first is None else first[0]
            self._register_heads(gi, keys[num_hit:], parents[num_hit:], entries, heads, parent_heads)
        self.start(seq_ids, token_ids, keys)

    def register_filled(self, seq_ids: list[int], token_ids: np.ndarray | None) -> None:
        """Mutates. Each sequence just wrote one token (`token_ids` int32 [n]; None: unknown from now on). A
        block this filled holds exactly its sequence's tokens (a writer into a shared block copied it
        first) and is live in every group (its last position was just written): each group registers the
        step's filled blocks together (a group's keys are its own, so only the order within a group counts)."""
        rows = self.seqs.rows(seq_ids)
        if token_ids is None:
            self._chains.forget(rows)
            return
        lengths = self.seqs.columns["length"]  # the pool counted the token already
        filled, parents, keys = self._chains.advance(rows, lengths, token_ids)
        if not filled.shape[0]:
            return
        places = [(self.seqs.id_of(row), length // self.block_size - 1)
                  for row, length in zip(filled.tolist(), lengths[filled].tolist(), strict=True)]
        for gi, g in enumerate(self.groups):
            tables = g.entries
            self.register(gi, keys, parents, [tables[seq_id][i] for seq_id, i in places],
                          [tables[seq_id][i - 1] if i else None for seq_id, i in places])

    def claim(self, entries: list[Entry], refcount: np.ndarray) -> None:
        """Mutates. Hit entries are about to gain holders: evictable ones leave the cache."""
        if entries:
            self.index.claim(np.array([e[0] for e in entries], dtype=np.int32))
            self.cached_blocks -= sum(e.shape[0] for e in entries if refcount[e[0]] == 0)

    def release(self, entries: list[Entry], heads: np.ndarray, units: int) -> list[Entry]:
        """Mutates. Entries of one group (`units` blocks each, unit 0 `heads` int32 [k]) whose holders all
        left, a sequence's head first: registered ones become evictable (tail first); returns the others,
        for the free stack."""
        head_list = heads.tolist()
        registered = list(map(self.entry_of.__contains__, head_list))
        self.index.release(heads)
        self.cached_blocks += units * sum(registered)
        return [e for e, known in zip(entries, registered, strict=True) if not known]

    def evict(self, num_entries: int) -> list[Entry]:
        """Mutates. Unregister the eviction policy's next `num_entries` victims, in its order; their blocks
        are the caller's."""
        heads = self.index.evict(num_entries)
        self._group_of[heads] = -1
        entries = list(map(self.entry_of.pop, heads.tolist()))
        self.cached_blocks -= sum(map(len, entries))
        return entries

    def evictable_entries(self) -> list[Entry]:
        """The cached entries in no particular order."""
        return [self.entry_of[h] for h in self.index.evictable_block_set().tolist()]

    # -- per-sequence chains ---------------------------------------------------------------------------

    def start(self, seq_ids: list[int], token_ids: np.ndarray, keys: np.ndarray) -> None:
        """Mutates. These sequences (their rows added) hold `token_ids` (int32 [n]) whose full blocks are keyed
        `keys`."""
        self._chains.start(self.seqs.rows(seq_ids), token_ids, keys, self.seqs.capacity_rows)

    def fork(self, parent: int, child: int) -> None:
        """Mutates. The child (its row added) continues the parent's chain."""
        self._chains.fork(self.seqs.row(parent), self.seqs.row(child), self.seqs.capacity_rows)

    # -- checks ----------------------------------------------------------------------------------------

    def check_integrity(self, refcount: np.ndarray, free_ids: np.ndarray, owner: np.ndarray) -> None:
        """Raise AssertionError if the cache disagrees with the pool's blocks: `refcount` int32 [num_blocks],
        `free_ids` int32 [num_free] and `owner` int64 [num_blocks] (the group whose tables hold each
        block, -1: none)."""
        self.index.check_integrity(refcount, free_ids)
        registered = self.index.registered_block_ids()
        grouped = np.flatnonzero(self._group_of >= 0)
        assert sorted(registered.tolist()) == sorted(self.entry_of) == grouped.tolist(), \
            "registered heads differ from the entry map"
        groups, owners = self._group_of[grouped], owner[grouped]
        wrong = np.flatnonzero((owners != -1) & (owners != groups))
        assert not wrong.shape[0], \
            f"block {grouped[wrong[0]]} registered in group {groups[wrong[0]]}, held in {owners[wrong[0]]}"
        cached = self.evictable_entries()
        assert sum(e.shape[0] for e in cached) == self.cached_blocks, "cached block count drifted"
        if cached and refcount[np.concatenate(cached)].any():
            held = next(entry for entry in cached if np.any(refcount[entry]))
            raise AssertionError(f"a unit of cached entry {held.tolist()} is held")
        # every entry at once (the tests check after every operation): its head first, its units held alike
        if self.entry_of:
            heads = np.fromiter(self.entry_of, dtype=np.int64, count=len(self.entry_of))
            entries = list(self.entry_of.values())
            sizes = np.array([entry.shape[0] for entry in entries])
            units = np.concatenate(entries)
            starts = np.cumsum(sizes) - sizes
            uneven = (units[starts] != heads) | np.logical_or.reduceat(
                refcount[units] != np.repeat(refcount[heads], sizes), starts)
            assert not uneven.any(), f"entry {entries[int(np.argmax(uneven))].tolist()}: units held unevenly"


# one compiled loop (not a Numba ufunc, whose wrapper is rebuilt in every process that loads it from the cache):
# every decode step salts the filled blocks' keys and parents for each group
@njit(cache=True)
def _salt_into(keys, salt, salted):
    """A group's key for chain key `keys[i]`: splitmix64 of it xor the group's salt; 0 (no parent) stays 0."""
    for i in range(keys.shape[0]):
        salted[i] = uint64(0) if keys[i] == 0 else mix(keys[i] ^ salt)
