"""`paged-prefix` and `radix`: `paged` holding a prefix index (docs/strategies.md). One strategy class;
the two registered strategies differ only in the index they build (`PrefixCacheKind`).

- `paged-prefix` (vLLM v1's automatic prefix caching): a hash-chain index (`prefix.hash_index`). A full
  block (prompt or decode-filled) is registered under its chain key (`prefix.chains`); a later prompt
  whose leading blocks have registered keys reuses them. Cached blocks are evicted in the order of
  `--eviction` (default `lru`: least recently used first, a freed request's last block before its first,
  vLLM's order; `eviction.py` lists the others).
- `radix` (SGLang's RadixAttention): a radix tree of pages (`prefix.radix_index`); the page is the block
  (`--block-size`, 1 = token granular as SGLang's default `page_size`). A prompt reuses the longest
  cached path of full pages from the root; a running request locks its path; eviction takes unlocked
  leaves in the order of `--eviction`, a run of a node's blocks at a time.

Both: a hit reuses a block by reference (refcount++), so only the rest of the prompt is computed. A hit
never covers the whole prompt: at least the last prompt token is recomputed, so the engine has a token
to produce logits from (vLLM's rule; a fully cached prompt recomputes its last block), and hit counts
compare across the two. A registered block whose refcount drops to 0 is *cached*: evictable, reusable
by a hit. New blocks come from never-cached free blocks first; cached ones are evicted only when none is
left. With a host tier or a fleet's shared tier the chain continues below the device (`prefix.tier_walk`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.allocators.paged import pool_counts
from workbench.allocators.paged.strategy import Counted, PagedStrategy
from workbench.allocators.prefix import admit_one_call, decode_append, take_release
from workbench.allocators.prefix.chains import SeqChains
from workbench.allocators.prefix.compiled_cache import CompiledPrefixPool
from workbench.allocators.prefix.eviction import make_policy
from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.prefix.host_tier import host_tier_for
from workbench.allocators.prefix.index import PrefixIndex
from workbench.allocators.prefix.keys import CHAIN_BASE
from workbench.allocators.prefix.radix_index import RadixPrefixIndex
from workbench.allocators.prefix.shared_tier import SharedTier, shared_tier_for
from workbench.allocators.prefix.tier_walk import NO_TIER_HITS, TierHits, TierWalk
from workbench.allocators.state.book import StateSpec
from workbench.allocators.values import NO_EFFECTS, AdmitResult, AppendResult, PrefixMatch, SeqSpec, StepEffects
from workbench.allocators.virtual.pages import KVGeometry
from workbench.presets import DEFAULT_SHARED_LINK_GB_S

_NO_KEY = np.zeros(1, dtype=np.uint64)  # the parent key of a prompt's first block
_NO_BLOCK = np.full(1, -1, dtype=np.int32)  # its parent block


class PrefixCacheStrategy(PagedStrategy):
    wants_token_ids = True

    def __init__(self, *, name: str, index: PrefixIndex, capacity_slots: int, block_size: int,
                 max_model_len: int, swap_slots: int = 0, host_cache_gib: float = 0.0, overlap_load: bool = False,
                 shared_tier_gib: float = 0.0, shared_link_gb_s: float = DEFAULT_SHARED_LINK_GB_S,
                 shared_tier: SharedTier | None = None, geometry: KVGeometry | None = None,
                 state: StateSpec | None = None) -> None:
        """`shared_tier`: the fleet's pool, one object for every replica (`registry.create`); without one a
        `shared_tier_gib` above 0 builds a pool of this strategy's own (a fleet of one)."""
        super().__init__(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                         swap_slots=swap_slots, state=state)
        self.name = name
        self.prefix = index
        self.needs_prompt_ids = True
        self._chains = SeqChains(block_size)
        self.host_tier = host_tier_for(host_cache_gib, block_size, geometry)  # None: evicted blocks drop a tier
        # the fleet's pool, one object for every replica; None: no shared tier
        self.shared_tier = shared_tier if shared_tier is not None else shared_tier_for(shared_tier_gib, block_size,
                                                                                       geometry)
        if self.host_tier is not None or self.shared_tier is not None:
            self._tiers = TierWalk(self.host_tier, self.shared_tier)
        self.overlap_load = overlap_load  # the clock's: host-tier loads overlap compute (allocators.base)
        self.shared_link_gb_s = shared_link_gb_s  # the clock's: a shared-tier promote crosses this link
        self.prefix_hit_tokens_host = 0  # host-tier hits (promoted)
        self.prefix_hit_tokens_shared = 0  # shared-tier hits (copied in)
        # A decode append (`prefix.decode_append`), a take and a release (`prefix.take_release`) may each run as
        # one compiled call only where every step of the step-by-step path is one of its functions. Exact types,
        # so a subclass, another index or another option (a tier, recurrent state) keeps the step-by-step path
        # until someone decides otherwise.
        self._one_call = (type(self) is PrefixCacheStrategy and type(index) is HashPrefixIndex
                          and self.host_tier is None and self.shared_tier is None and self.state is None)

    # -- optional capabilities (allocators.base) ------------------------------------------------

    def compiled_pool(self) -> CompiledPrefixPool | None:
        """For this class itself (a subclass may change a verb), in the one-call case (`_one_call`: the hash
        index, no tier or state) under LRU, holding no sequence: its arrays lent to the compiled loop
        (`prefix.compiled_cache`); any other case takes the general loop."""
        if type(self) is not PrefixCacheStrategy or not self._one_call or len(self.tables.seqs) \
                or self.prefix.one_call_view(self.num_blocks, 0) is None:
            return None
        return CompiledPrefixPool(self)

    @property
    def host_tier_blocks(self) -> int:
        return 0 if self.host_tier is None else self.host_tier.num_blocks

    def end_step(self) -> StepEffects:
        """Mutates: the tiers' step ends (`TierWalk.end_step`), and the step's recurrent-state copies."""
        if self.state is not None:
            copies = self.state.take_copies()
            return StepEffects(state_copies=copies) if copies else NO_EFFECTS
        return NO_EFFECTS if self._tiers is None else self._tiers.end_step(self.block_size)

    def counters(self) -> dict[str, int]:
        """The prefix counters, and with a host or shared tier its hits and the blocks moved each way."""
        counters = super().counters()
        if self.host_tier is not None:
            counters["prefix_hit_tokens_host"] = self.prefix_hit_tokens_host
        if self.shared_tier is not None:
            counters["prefix_hit_tokens_shared"] = self.prefix_hit_tokens_shared
        return counters if self._tiers is None else {**counters, **self._tiers.counters()}

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        return self._cached_tokens(SeqSpec(token_ids, token_ids.shape[0]))[0]

    def prefix_match(self, token_ids: np.ndarray) -> PrefixMatch:
        spec = SeqSpec(token_ids, token_ids.shape[0])
        tokens, keys = self._cached_tokens(spec)
        return PrefixMatch(tokens, self.prefix.tree_path(keys, self._max_hit(spec)))

    def _cached_tokens(self, spec: SeqSpec) -> tuple[int, np.ndarray]:
        """Pure. `cached_prompt_tokens` of the prompt, and its block keys (`_lookup`)."""
        hits, keys, below = self._lookup(spec)
        return (hits.shape[0] + below.num_host + below.num_shared) * self.block_size, keys

    def _max_hit(self, spec: SeqSpec) -> int:
        """Full blocks of the prompt a hit may cover: the last prompt token is left to compute."""
        return (spec.num_tokens - 1) // self.block_size

    def cached_block_ids(self) -> np.ndarray:
        """Blocks kept only as prefix cache, next to evict first, int32 [num_cached]. Pure."""
        return self.prefix.evictable_block_ids()

    def registered_block_ids(self) -> np.ndarray:
        return self.prefix.registered_block_ids()

    # -- the block manager's hooks (`paged.strategy`) -------------------------------------------

    def _lookup(self, spec: SeqSpec) -> tuple[np.ndarray, np.ndarray, TierHits]:
        keys = self._chains.prompt_keys(spec.token_ids)
        max_hit = self._max_hit(spec)
        hits = self.prefix.lookup(keys, max_hit)
        if self.state is not None:  # a hit needs the recurrent state where it ends: blocks past it are unusable
            hits = hits[:self.state.hit(keys, hits.shape[0])]
        below = NO_TIER_HITS if self._tiers is None else self._tiers.lookup(keys, hits.shape[0], max_hit)
        return hits, keys, below

    def _branch_point(self, keys: np.ndarray, spec: SeqSpec) -> int:
        """Where the prompt leaves the blocks the index holds (whatever their checkpoints): Marconi's branch."""
        if self.state is None or self.state.spec.policy != "marconi":
            return 0
        return self.prefix.lookup(keys, self._max_hit(spec)).shape[0] * self.block_size

    def _save_states(self, row: int, start: int, stop: int, keys: np.ndarray, first_block: int,
                     from_root: bool = False) -> None:
        """Mutates. The checkpoints the policy takes as the row's sequence computes positions [start, stop);
        `keys[i]` is the chain key of block `first_block + i` (uint64), all of them from the first block with
        `from_root`. A checkpoint lives with the block it ends on, so it is taken only where the index holds
        that prefix (a hit could never reach it otherwise): the row's own block, or with `from_root` any block
        a lookup of the keys reaches (the row may hold an unregistered copy of a cached prefix)."""
        book, bs = self.state, self.block_size
        final_len = int(self.tables.seqs.column("final_len")[row])
        for position in book.wants(row, start, stop, final_len):
            index = position // bs - 1
            key = int(keys[index - first_block])
            if book.has(key) or not book.room_for_one():
                continue
            block = int(self.tables.blocks_at(np.array([row]), np.array([index]))[0])
            if not self._reachable(block, key, keys if from_root else None, index):
                continue
            room = book.make_room()
            if room is None:  # the budget holds only the checkpoint an admission is copying
                continue
            self._free.push(room)
            k = book.spec.blocks_per_state
            if self._free.size + self._num_cached_blocks() < k:  # no room short of evicting other checkpoints
                continue
            taken = self._take(k)
            # taking the blocks may have evicted the cached prefix it would resume
            if self._reachable(block, key, keys if from_root else None, index):
                book.save(key, position, taken)
            else:
                self._free.push(taken)

    def _reachable(self, block: int, key: int, keys_from_root: np.ndarray | None, index: int) -> bool:
        """Pure. Whether a hit can reach block `index` of a sequence: its own `block` is registered under `key`,
        or a lookup of its keys from the first block (when given) reaches that far."""
        return self.prefix.registered_under(block, key) or (
            keys_from_root is not None and self.prefix.lookup(keys_from_root, index + 1).shape[0] == index + 1)

    def _on_admitted(self, seq_ids: list[int], spec: SeqSpec, keys: np.ndarray, blocks: np.ndarray,
                     num_hit: int, num_held: int, below: TierHits) -> None:
        """Only the `num_held` tokens held (a chunked admission's first chunk) fill blocks now. The tiers'
        blocks after the `num_hit` device hits were copied in: they are registered like new ones."""
        keys = keys[:num_held // self.block_size]
        num_full = keys.shape[0]
        # a hit's key is registered already; a recomputed copy of a registered key is the index's to keep or not
        if num_full > num_hit:
            # each new block's predecessor's key and block: the ones before it (key 0, block -1 before the first)
            if num_hit:
                parents, before = keys[num_hit - 1:num_full - 1], blocks[num_hit - 1:num_full - 1]
            else:
                parents = np.concatenate((_NO_KEY, keys[:-1]))
                before = np.concatenate((_NO_BLOCK, blocks[:num_full - 1]))
            self.prefix.insert(parents, keys[num_hit:], blocks[num_hit:num_full], before)
        rows = self.tables.seqs.rows(seq_ids)
        self._chains.start(rows, spec.token_ids[:num_held], keys, self.tables.seqs.capacity_rows)
        if self.state is not None and self.state.checkpoints_taken:  # one serves the group: they share the prompt
            self._save_states(int(rows[0]), num_hit * self.block_size, num_held, keys, 0, from_root=True)
        self._count_hits(spec, num_hit, below)

    def _count_hits(self, spec: SeqSpec, num_hit: int, below: TierHits) -> None:
        """Mutates the hit counters: a prompt admitted, `num_hit` blocks of it on the device, `below` in the tiers."""
        self.prefix_query_tokens += spec.num_tokens
        self.prefix_hit_tokens += num_hit * self.block_size
        self.prefix_hit_tokens_host += below.num_host * self.block_size
        self.prefix_hit_tokens_shared += below.num_shared * self.block_size

    def _place_admission(self, seq_ids: list[int], spec: SeqSpec, counted: Counted) -> AdmitResult:
        """`PagedStrategy._place_admission`; where eligible (`_one_call`, the index's table has room for the new
        keys) in one compiled call of the same steps (`prefix.admit_one_call`)."""
        bs = self.block_size
        hits, keys, below, num_tokens, num_blocks, revived, need = counted
        num_hit, num_full, n = hits.shape[0], num_tokens // bs, len(seq_ids)
        view = self.prefix.one_call_view(self.num_blocks, num_full - num_hit) if self._one_call else None
        if view is None:
            return super()._place_admission(seq_ids, spec, counted)
        slot_key, slot_block, next_copy, registered, key_of, lru = view
        free_ids, free_size = self._free.compiled_view()
        fresh = np.empty(need, dtype=np.int32)
        token_ids = np.ascontiguousarray(spec.token_ids, dtype=np.int32)

        def place(rows, table, length, final_len, num_blocks_of, last_block):
            self._chains.fit(self.tables.seqs.capacity_rows)  # the rows just added may have grown the tables
            salt, chain_key, tail_sum, known = self._chains.compiled_view()
            return admit_one_call.place_prompt(rows, hits, fresh, keys, num_full, num_tokens, spec.final_len, token_ids,
                                               self._refcount, free_ids, free_size, table, length, final_len,
                                               num_blocks_of, last_block, *lru, slot_key, slot_block, next_copy,
                                               registered, key_of, salt, chain_key, tail_sum, known)

        from_free, keys_delta = self.tables.add_compiled(seq_ids, num_blocks, place)
        self._free.popped(from_free)
        self.prefix.keys_changed(keys_delta)
        self.prefix_evicted_blocks += need - from_free
        pool_counts.added(self.counts, num_tokens, n, num_blocks, (num_hit - revived) * bs)
        self._count_hits(spec, num_hit, below)
        return AdmitResult(True, cached_tokens=num_hit * bs)

    def _on_extended(self, rows: np.ndarray, length: int, token_ids: np.ndarray, table: np.ndarray) -> None:
        parents, keys = self._chains.extend(rows, length, token_ids)
        first = length // self.block_size  # the first block this chunk can fill
        filled = table[first:first + keys.shape[0]]
        # each filled block's predecessor in the table (-1 for the first block)
        before = np.concatenate([[-1], table])[first:first + keys.shape[0]].astype(np.int32)
        self.prefix.insert(parents, keys, filled, before)
        if self.state is not None and self.state.checkpoints_taken and keys.shape[0]:
            self._save_states(int(rows[0]), length, length + token_ids.shape[0], keys, first)

    def _register_filled(self, rows: np.ndarray, token_ids: np.ndarray | None) -> None:
        """The block just filled holds exactly its sequence's tokens: a writer into a shared block copies
        it first, so diverging samples each register their own block."""
        if token_ids is None:
            self._chains.forget(rows)
            return
        lengths = self.tables.seqs.column("length")
        filled_rows, parents, keys = self._chains.advance(rows, lengths, token_ids)
        if filled_rows.shape[0]:
            self.prefix.insert(parents, keys, *self.tables.last_two_blocks(filled_rows))
            if self.state is not None and self.state.checkpoints_taken:  # a decode step ends on each block it fills
                for row, key in zip(filled_rows.tolist(), keys.tolist(), strict=True):
                    length = int(lengths[row])
                    self._save_states(row, length - 1, length, np.array([key], dtype=np.uint64),
                                      length // self.block_size - 1)

    def _register_accepted(self, rows: np.ndarray, first: np.ndarray, accepted: np.ndarray,
                           token_ids: np.ndarray | None) -> None:
        """Accepted drafts extend the chains token by token, as decode appends do, one round per draft
        position; a block they fill is registered (never a draft slot: these tokens are verified)."""
        if token_ids is None:
            self._chains.forget(rows[accepted > 0])
            return
        starts = np.concatenate([[0], np.cumsum(accepted)[:-1]])  # each row's first token in `token_ids`
        lengths = self.tables.seqs.column("length").copy()  # [capacity_rows]: position written + 1, per round
        for j in range(int(accepted.max(initial=0))):
            taking = accepted > j
            rows_j = rows[taking]
            lengths[rows_j] = first[taking] + j + 1
            filled, parents, keys = self._chains.advance(rows_j, lengths, token_ids[starts[taking] + j])
            if filled.shape[0]:
                index = (lengths[filled] - 1) // self.block_size
                self.prefix.insert(parents, keys, self.tables.blocks_at(filled, index),
                                   self.tables.blocks_at(filled, index - 1))

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult | None:
        """`PagedStrategy.append_if_room`; where eligible (`_one_call`, token ids given, the index's
        table has room) in one compiled call of the same steps (`prefix.decode_append`)."""
        view = None
        if self._one_call and token_ids is not None:
            rows = self.tables.seqs.rows(seq_ids)
            view = self.prefix.one_call_view(self.num_blocks, rows.shape[0])
        if view is None:
            return super().append_if_room(seq_ids, token_ids)
        slot_key, slot_block, next_copy, registered, key_of, lru = view
        salt, chain_key, tail_sum, known = self._chains.compiled_view()
        slots = np.empty(rows.shape[0], dtype=np.int64)
        copies = np.empty((rows.shape[0], 2), dtype=np.int32)  # a sequence takes at most one block

        def append(length, final_len, num_blocks, swapped, last_block, table, scratch, mark):
            free_ids, free_size = self._free.compiled_view()
            return decode_append.append_evicting(rows, token_ids, length, final_len, num_blocks, swapped, last_block,
                                                 table, self._refcount, self.block_size, scratch, mark, free_ids,
                                                 free_size, *lru, slot_key, slot_block, next_copy, registered, key_of,
                                                 salt, CHAIN_BASE, chain_key, tail_sum, known, slots, copies)

        done = self.tables.append_compiled(seq_ids, append)
        if done is None:
            return None
        _, from_free, evicted, num_copies, copied_slots, grown, keys_delta = done
        self._free.popped(from_free)
        self.prefix.keys_changed(keys_delta)
        self.prefix_evicted_blocks += evicted
        pool_counts.appended(self.counts, rows.shape[0], copied_slots, grown)
        return AppendResult(slots=slots, copies=copies[:num_copies])

    def _on_forked(self, parent_row: int, child_row: int) -> None:
        self._chains.fork(parent_row, child_row, self.tables.seqs.capacity_rows)

    def _num_cached_blocks(self) -> int:
        return self.prefix.num_evictable()

    def _take(self, k: int) -> np.ndarray:
        """Never-cached free blocks go first; cached ones are evicted only when none is left, and state
        checkpoints only when no cached block is left either."""
        if k <= self._free.size:
            return self._free.pop(k)
        if k > self.num_allocatable_blocks():
            raise RuntimeError(f"out of blocks: need {k}, {self.num_allocatable_blocks()} allocatable")
        short = k - self._free.size - self._num_cached_blocks()
        if short > 0:  # the checkpoints' blocks join the free stack
            self._free.push(self.state.evict_blocks(short))
            if k <= self._free.size:
                return self._free.pop(k)
        view = self.prefix.one_call_view(self.num_blocks, 0) if self._one_call else None
        if view is not None:
            return self._take_evicting(k, view)
        taken = self._free.pop(self._free.size)
        self.prefix_evicted_blocks += k - taken.shape[0]
        if self._tiers is None and self.state is None:
            return np.concatenate([taken, self.prefix.evict(k - taken.shape[0])])
        evicted, keys = self.prefix.evict_keyed(k - taken.shape[0])
        if self._tiers is not None:
            self._tiers.demote(keys, evicted)
        if self.state is not None:  # a checkpoint ending on an evicted block goes with it
            self._free.push(self.state.drop(keys))
        return np.concatenate([taken, evicted])

    def _take_evicting(self, k: int, view: tuple) -> np.ndarray:
        """Mutates. `_take` of k blocks, more than are free, in one compiled call (`prefix.take_release`)."""
        slot_key, slot_block, next_copy, registered, key_of, lru = view
        free_ids, free_size = self._free.compiled_view()
        taken = np.empty(k, dtype=np.int32)
        from_free, lost = take_release.take_evicting(taken, free_ids, free_size, *lru, slot_key, slot_block,
                                                     next_copy, registered, key_of)
        self._free.popped(from_free)
        self.prefix.keys_changed(-lost)
        self.prefix_evicted_blocks += k - from_free
        return taken

    def _release(self, blocks: np.ndarray) -> None:
        view = self.prefix.one_call_view(self.num_blocks, 0) if self._one_call else None
        if view is None:
            self._free.push(self.prefix.release(blocks))
            return
        _, _, _, registered, _, lru = view
        free_ids, free_size = self._free.compiled_view()
        self._free.pushed(take_release.release_to_cache(blocks, registered, *lru, free_ids, free_size,
                                                        np.empty(blocks.shape[0], dtype=np.int32)))

    def check_integrity(self) -> None:
        super().check_integrity()
        state_ids = None if self.state is None else self.state.block_ids()
        self.prefix.check_integrity(self._refcount, self._free.ids() if state_ids is None or not state_ids.shape[0]
                                    else np.concatenate([self._free.ids(), state_ids]))
        if self._tiers is not None:
            self._tiers.check_integrity()


def _hash_index(eviction: str = "lru") -> PrefixIndex:
    return HashPrefixIndex(make_policy(eviction))


def _radix_index(eviction: str = "lru") -> PrefixIndex:
    return RadixPrefixIndex(eviction)


@dataclass(frozen=True)
class PrefixCacheKind:
    """A registered prefix cache (`registry`): `PrefixCacheStrategy` with the index `make_index` builds."""

    name: str
    make_index: Callable[[str], PrefixIndex]  # from `--eviction`
    # the index of the per-layer-group form (`registry.create_hybrid`, docs/hybrid.md), from `--eviction`;
    # None: no such form (a radix tree does not answer a sliding-window group's one-key lookups)
    hybrid_prefix_index: Callable[..., PrefixIndex] | None

    def __call__(self, *, eviction: str = "lru", **options: Any) -> PrefixCacheStrategy:
        return PrefixCacheStrategy(name=self.name, index=self.make_index(eviction), **options)


PAGED_PREFIX = PrefixCacheKind("paged-prefix", _hash_index, hybrid_prefix_index=_hash_index)
RADIX = PrefixCacheKind("radix", _radix_index, hybrid_prefix_index=None)
