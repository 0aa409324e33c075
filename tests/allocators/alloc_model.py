"""A miniature engine for allocator tests: it executes what a strategy returns on a fake KV pool.

The pool stores token ids instead of K/V rows. Every write, copy-on-write pair, admission copy and
swap move, a host tier's demotes and promotes (into a model host tier) and a fleet's shared-tier moves
(into a model shared tier, one array for every replica's model), is executed exactly as the engine
would, and `verify()` reads each sequence back through `slot_mapping` and `describe`: a wrong block
table, a missed copy or a prefix hit onto the wrong block shows up as a wrong token.
`reference_partition()` recomputes the six-way split of held memory from the sequences' slot
mappings alone, independently of the strategy's counters.
"""

from __future__ import annotations

import numpy as np

from tests.allocators.block_partition import block_partition
from workbench.allocators.values import ContiguousDescriptor, PagedDescriptor, SeqSpec

_DEMOTED, _PROMOTED = -2, -3  # what a block holds once its content moved to the other tier


class PoolModel:
    def __init__(self, strategy, host_slots: int = 0, shared: np.ndarray | None = None) -> None:
        """`shared`: the fleet's model shared tier (token ids, one array for every replica's model); built
        here when the strategy has a shared tier and none is given."""
        self.s = strategy
        self.bs = strategy.block_size
        self.device = np.full(strategy.virtual_slots, -1, dtype=np.int64)  # [virtual_slots] token ids
        self.host = np.full(max(host_slots, 1), -1, dtype=np.int64)
        self.tokens: dict[int, list[int]] = {}  # seq id -> its logical token ids
        self.final: dict[int, int] = {}
        self.placed_len: dict[int, int] = {}  # tokens a sequence held when its extent was last placed
        self.swapped: set[int] = set()
        self.cow_copies = 0
        tier_blocks = strategy.host_tier_blocks  # a prefix cache's host tier, 0 for none
        self.tier = np.full(tier_blocks * self.bs, -1, dtype=np.int64) if tier_blocks else None
        self.tier_used: set[int] = set()  # host-tier blocks holding a demoted block, from the moves alone
        if shared is None and strategy.shared_tier_blocks:
            shared = np.full(strategy.shared_tier_blocks * self.bs, -1, dtype=np.int64)
        self.shared = shared
        self.effects = strategy.end_step()  # after the last operation (a fresh strategy has done nothing)

    # -- operations, each executed like the engine would ------------------------------------------

    def admit(self, seq_ids: list[int], prompt: np.ndarray, final_len: int, num_new_tokens: int | None = None):
        """Admit a group; with `num_new_tokens` (chunked prefill) it holds the hit plus that many tokens
        and the rest of the prompt comes through `extend`."""
        spec = SeqSpec(prompt.astype(np.int32), final_len, num_new_tokens)
        held = self._held_blocks()
        result = self.s.admit(seq_ids, spec)
        self._host_moves(held)
        if not result.admitted:
            return result
        first = seq_ids[0]
        cached = result.cached_tokens
        assert 0 <= cached < prompt.shape[0], "a hit must leave the last prompt token to compute"
        held = spec.num_held(cached)
        hit_slots = self.s.slot_mapping(first, 0, cached)
        assert np.array_equal(self.device[hit_slots], prompt[:cached]), "prefix hit onto the wrong KV"
        self.device[self.s.slot_mapping(first, cached, held)] = prompt[cached:held]
        if result.copies is not None:
            self._copy(result.copies)
        for seq_id in seq_ids:
            self.tokens[seq_id] = prompt[:held].tolist()
            self.final[seq_id] = final_len
            self.placed_len[seq_id] = prompt.shape[0]
        return result

    def extend(self, seq_ids: list[int], new: np.ndarray):
        """The group's next prompt tokens (chunked prefill), written through the first sequence's slots
        and delivered to the others by the returned copies, as the engine's contract allows."""
        held = self._held_blocks()
        result = self.s.extend(seq_ids, new.astype(np.int32))
        self._host_moves(held)
        if not result.admitted:
            return result
        length = len(self.tokens[seq_ids[0]])
        self.device[self.s.slot_mapping(seq_ids[0], length, length + new.shape[0])] = new
        if result.copies is not None:
            self._copy(result.copies)
        for seq_id in seq_ids:
            self.tokens[seq_id].extend(new.tolist())
        return result

    def append(self, seq_ids: list[int], rng: np.random.Generator, *, if_room: bool = False) -> None:
        self.append_tokens(seq_ids, rng.integers(0, 1000, len(seq_ids)).astype(np.int32), if_room=if_room)

    def append_tokens(self, seq_ids: list[int], new: np.ndarray, *, if_room: bool = False) -> None:
        """Append these token ids (int32 [len(seq_ids)]), telling a strategy that wants them; `if_room`:
        through `append_if_room` (the scheduler's call), which must not refuse what `can_append` allows."""
        held = self._held_blocks()
        call = self.s.append_if_room if if_room else self.s.append
        result = call(seq_ids, new) if self.s.wants_token_ids else call(seq_ids)
        assert result is not None, "append_if_room refused an append the pool has room for"
        self._host_moves(held)
        self._copy(result.copies)
        self.cow_copies += result.copies.shape[0]
        assert np.unique(result.slots).shape[0] == len(seq_ids), "two sequences write one slot"
        self.device[result.slots] = new
        for seq_id, token in zip(seq_ids, new.tolist(), strict=True):
            self.tokens[seq_id].append(token)

    def speculate(self, seq_ids: list[int], last: np.ndarray, drafts: np.ndarray, draft_tokens: np.ndarray) -> bool:
        """A speculative step's slots (`append_with_drafts`): each sequence's last token `last[i]` and `drafts[i]`
        draft slots, written with `draft_tokens` (concatenated); the drafts count as the sequences' tokens until
        `settle`. False, and nothing changed, when the pool refuses."""
        held = self._held_blocks()
        result = self.s.append_with_drafts(seq_ids, last if self.s.wants_token_ids else None, drafts)
        if result is None:
            return False
        self._host_moves(held)
        self._copy(result.copies)
        self.cow_copies += result.copies.shape[0]
        self.device[result.slots] = last
        at = 0
        for seq_id, token, d in zip(seq_ids, last.tolist(), drafts.tolist(), strict=True):
            self.tokens[seq_id].append(token)
            length = len(self.tokens[seq_id])
            self.device[self.s.slot_mapping(seq_id, length, length + d)] = draft_tokens[at:at + d]
            self.tokens[seq_id] += draft_tokens[at:at + d].tolist()
            at += d
        return True

    def settle(self, seq_ids: list[int], drafts: np.ndarray, accepted: np.ndarray) -> None:
        """`settle_drafts`: the first accepted[i] drafts of each sequence are kept (verified: the tokens written
        stand), the rest rolled back."""
        verified = []
        for seq_id, d, a in zip(seq_ids, drafts.tolist(), accepted.tolist(), strict=True):
            kept = len(self.tokens[seq_id]) - d + a
            verified += self.tokens[seq_id][kept - a:kept]
            del self.tokens[seq_id][kept:]
        held = self._held_blocks()
        self.s.settle_drafts(seq_ids, drafts, accepted, np.array(verified, dtype=np.int32))
        self._host_moves(held)

    def fork(self, parent: int, child: int):
        result = self.s.fork(parent, child)
        if result.admitted:
            if result.copies is not None:
                self._copy(result.copies)
            self.tokens[child] = list(self.tokens[parent])
            self.final[child] = self.final[parent]
            self.placed_len[child] = len(self.tokens[parent])
        return result

    def free(self, seq_id: int) -> None:
        self.s.free(seq_id)
        del self.tokens[seq_id], self.final[seq_id], self.placed_len[seq_id]
        self.swapped.discard(seq_id)

    def swap_out(self, seq_ids: list[int]) -> None:
        moves = self.s.swap_out(seq_ids).moves
        for src, dst in moves.tolist():
            self.host[dst * self.bs:(dst + 1) * self.bs] = self.device[src * self.bs:(src + 1) * self.bs]
        self.swapped.update(seq_ids)

    def swap_in(self, seq_ids: list[int]) -> None:
        held = self._held_blocks()
        moves = self.s.swap_in(seq_ids).moves
        self._host_moves(held)
        for src, dst in moves.tolist():
            self.device[dst * self.bs:(dst + 1) * self.bs] = self.host[src * self.bs:(src + 1) * self.bs]
        self.swapped.difference_update(seq_ids)
        self.placed_len.update((i, len(self.tokens[i])) for i in seq_ids)

    def _held_blocks(self) -> set[int]:
        """Device blocks the on-device sequences hold (with a host or shared tier only: none may be demoted)."""
        if self.tier is None and self.shared is None:
            return set()
        bs = self.bs
        return {int(slot) // bs for i in self.on_device()
                for slot in self.s.slot_mapping(i, 0, len(self.tokens[i]))[::bs].tolist()}

    def _host_moves(self, held: set[int]) -> None:
        """Execute the tiers' moves of the operation just made in the kernel runner's order (one operation
        is one step here): shared-tier spills, host-tier demotes, shared-tier demotes, host-tier promotes,
        shared-tier promotes. A demoted device block and a promoted host-tier block are poisoned after
        the move (a shared-tier promote copies: its entry stays)."""
        self.effects = effects = self.s.end_step()
        for kind in ("demote", "promote", "shared_spill", "shared_demote", "shared_promote"):
            dst = getattr(effects, kind)[:, 1]
            assert np.unique(dst).size == dst.size, f"{kind}: a step writes a block twice"
        shared_dst = np.concatenate([effects.shared_spill[:, 1], effects.shared_demote[:, 1]])
        assert np.unique(shared_dst).size == shared_dst.size, "a step writes a shared block twice"
        bs, device, tier, shared = self.bs, self.device, self.tier, self.shared
        for host, block in effects.shared_spill.tolist():
            assert host in self.tier_used, f"host block {host} spilled, but it holds nothing"
            shared[block * bs:(block + 1) * bs] = tier[host * bs:(host + 1) * bs]
        for dev, host in effects.demote.tolist():
            assert dev not in held, f"block {dev}, held by a live sequence, was demoted"
            tier[host * bs:(host + 1) * bs] = device[dev * bs:(dev + 1) * bs]
            device[dev * bs:(dev + 1) * bs] = _DEMOTED
            self.tier_used.add(host)
        for dev, block in effects.shared_demote.tolist():
            assert dev not in held, f"block {dev}, held by a live sequence, was demoted"
            shared[block * bs:(block + 1) * bs] = device[dev * bs:(dev + 1) * bs]
            device[dev * bs:(dev + 1) * bs] = _DEMOTED
        for host, dev in effects.promote.tolist():
            assert host in self.tier_used, f"host block {host} promoted, but it holds nothing"
            device[dev * bs:(dev + 1) * bs] = tier[host * bs:(host + 1) * bs]
            tier[host * bs:(host + 1) * bs] = _PROMOTED
            self.tier_used.remove(host)
        for block, dev in effects.shared_promote.tolist():
            rows = shared[block * bs:(block + 1) * bs]
            assert (rows >= 0).all(), f"shared block {block} promoted, but it holds nothing"
            device[dev * bs:(dev + 1) * bs] = rows

    def host_tier_slots(self) -> tuple[int, int, int] | None:
        """(host used, host free, host capacity) slots as the engine's step row reports them; None
        without a host tier."""
        if self.tier is None:
            return None
        row = dict(self.effects.columns)
        return row["host_token_slots"], row["host_free_slots"], self.s.host_tier_blocks * self.bs

    def _copy(self, pairs: np.ndarray) -> None:
        for src, dst in pairs.tolist():
            self.device[dst * self.bs:(dst + 1) * self.bs] = self.device[src * self.bs:(src + 1) * self.bs]

    # -- checks -----------------------------------------------------------------------------------

    def on_device(self) -> list[int]:
        return [s for s in self.tokens if s not in self.swapped]

    def verify(self) -> None:
        """Every on-device sequence reads back its own tokens, through slot_mapping and describe."""
        ids = self.on_device()
        mappings = [self.s.slot_mapping(seq_id, 0, len(self.tokens[seq_id])) for seq_id in ids]
        for seq_id, slots in zip(ids, mappings, strict=True):
            assert np.array_equal(self.device[slots], self.tokens[seq_id]), f"sequence {seq_id} reads wrong KV"
        if ids:
            assert np.array_equal(descriptor_slots(self.s.describe(ids)), np.concatenate(mappings))

    def reference_partition(self) -> tuple[int, int, int]:
        """(token, reserved, internal) slots recomputed from slot mappings and final lengths."""
        # memory comes in blocks, or in pages behind virtual extents (page-aligned, so a page is slot // page)
        unit = self.bs if self.s.kernel_mode == "paged" else self.s.page_tokens
        if not unit:
            return self._contiguous_reference()
        written, reach = block_partition(((self.s.slot_mapping(i, 0, len(self.tokens[i])), 0, self.final[i])
                                          for i in self.on_device()), unit)
        token = int(written.sum())
        reserved = int(np.maximum(reach - written, 0).sum())
        return token, reserved, written.shape[0] * unit - token - reserved

    def reference_reservation(self, seq_id: int) -> int:
        """The extent a contiguous strategy reserves for this sequence, before a buddy round-up."""
        f, placed, s = self.final[seq_id], self.placed_len[seq_id], self.s
        if s.name == "contiguous-pow2" and getattr(s, "pow2_round", "final") == "output":  # prompt exact
            return min(placed + (1 << (f - placed - 1).bit_length() if f > placed else 0), s.max_model_len)
        return {"contiguous-max": s.max_model_len, "contiguous-oracle": f,
                "contiguous-pow2": min(1 << (f - 1).bit_length(), s.max_model_len)}[s.name]

    def _contiguous_reference(self) -> tuple[int, int, int]:
        ids = self.on_device()
        token = sum(len(self.tokens[i]) for i in ids)
        final = sum(self.final[i] for i in ids)
        alloc = 0
        for i in ids:
            size = self.reference_reservation(i)
            alloc += 1 << (size - 1).bit_length() if self.s.fit == "buddy" else size
        return token, final - token, alloc - final


def reference_free_runs(model: PoolModel) -> list[int]:
    """Sizes of the maximal free runs of a first/best-fit contiguous pool, from the extents alone."""
    s = model.s
    used = np.zeros(s.capacity_slots + 1, dtype=bool)
    used[-1] = True  # sentinel ends the last run
    ids = model.on_device()
    if ids:
        for start, i in zip(s.describe(ids).kv_start.tolist(), ids, strict=True):
            used[start:start + model.reference_reservation(i)] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[True], used]).astype(np.int8)))  # run starts and ends
    return (edges[1::2] - edges[0::2]).tolist()


def descriptor_slots(d: PagedDescriptor | ContiguousDescriptor) -> np.ndarray:
    """Every slot a kernel reads through the descriptor, sequence after sequence, int64 [total tokens]."""
    if isinstance(d, ContiguousDescriptor):
        return np.concatenate([np.arange(s, s + n) for s, n in zip(d.kv_start.tolist(), d.kv_len.tolist(),
                                                                    strict=True)])
    out = []
    for i in range(d.kv_indptr.shape[0] - 1):
        blocks = d.kv_indices[d.kv_indptr[i]:d.kv_indptr[i + 1]].astype(np.int64)
        assert 1 <= d.kv_last_page_len[i] <= d.block_size
        slots = (blocks[:, None] * d.block_size + np.arange(d.block_size)).ravel()
        out.append(slots[:slots.shape[0] - d.block_size + int(d.kv_last_page_len[i])])
    return np.concatenate(out)
