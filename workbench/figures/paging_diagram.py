"""Paging by hand: a tiny pool driven through admit / append / fork / free by a real strategy
(`workbench.allocators.registry.create`), read back through the strategy protocol only, and drawn:
each sequence's logical blocks with the physical block each maps to, and the physical pool with the
kind of every slot and the reference count of every block.

`PagingWalk` records one `PoolPicture` per operation; `draw_pictures` puts pictures of several
strategies side by side. The pictures are derived from `describe`, `slot_mapping` and the final
lengths, independently of the strategy's own `snapshot`, so agreeing with it is a real check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from workbench.allocators import registry
from workbench.allocators.values import ContiguousDescriptor, SeqSpec
from workbench.figures import style

# slot kinds, in drawing priority: a slot shared by several holders shows the strongest claim on it
TOKEN, RESERVED, INTERNAL, FREE = 3, 2, 1, 0
KIND_COLUMN = {TOKEN: "token_slots", RESERVED: "reserved_slots", INTERNAL: "internal_frag_slots", FREE: "free_slots"}


@dataclass(frozen=True)
class SeqPicture:
    label: str
    length: int  # tokens written
    final_len: int
    blocks: tuple[int, ...]  # physical block of each logical block (paged); first and last slot (contiguous)


@dataclass(frozen=True)
class PoolPicture:
    """The pool after one operation. Arrays are per physical slot [capacity_slots] or block [num_blocks]."""

    strategy: str
    title: str
    block_size: int  # slots per drawn block (the contiguous pool is drawn in the same blocks for comparison)
    paged: bool
    kinds: np.ndarray  # int8 [capacity_slots]: TOKEN, RESERVED, INTERNAL or FREE
    refcount: np.ndarray  # int32 [num_blocks]: sequences whose table holds the block (paged; 0 for contiguous)
    seqs: tuple[SeqPicture, ...]
    copies: tuple[tuple[int, int], ...]  # (src, dst) block copies the operation asked the engine to run
    refused: bool  # the operation was an admission the strategy refused

    def counts(self) -> dict[str, int]:
        """Slots per kind, named like the Snapshot columns (free includes any external fragmentation)."""
        return {column: int(np.count_nonzero(self.kinds == kind)) for kind, column in KIND_COLUMN.items()}


def drawable(strategy) -> bool:
    """Whether the kernel's view of the strategy is the physical pool itself (block tables or extents of
    it), which is what these pictures draw; not so for virtual memory mapped page by page."""
    return strategy.virtual_slots == strategy.capacity_slots


class PagingWalk:
    """One real strategy instance and the pictures of its pool, one per operation. Sequences are named
    by labels ("A", "B", ...); the walk keeps their final lengths (the strategy knows them too)."""

    def __init__(self, strategy: str, *, capacity_slots: int, block_size: int, max_model_len: int,
                 **options) -> None:
        """`options`: run options the strategy declares (e.g. `page_kib` small enough for a tiny pool)."""
        self.strategy = registry.create(strategy, capacity_slots=capacity_slots, block_size=block_size,
                                        max_model_len=max_model_len, **options)
        if not drawable(self.strategy):
            raise ValueError(f"strategy {strategy!r} addresses virtual memory: its kernel view is no picture of "
                             "the physical pool")
        self.name = strategy
        self.draw_block_size = block_size
        self.ids: dict[str, int] = {}  # live sequences only
        self.next_id = 0
        self.lengths: dict[str, int] = {}
        self.final_lens: dict[str, int] = {}
        self.placed_lens: dict[str, int] = {}  # tokens held when the sequence was placed
        self.pictures: list[PoolPicture] = []

    def admit(self, label: str, prompt_tokens: int, final_len: int) -> PoolPicture:
        seq_id = self._new_id()
        token_ids = np.arange(prompt_tokens, dtype=np.int32) + 1000 * seq_id  # distinct prompts, no sharing
        result = self.strategy.admit([seq_id], SeqSpec(token_ids, final_len))
        if result.admitted:
            self.ids[label], self.lengths[label], self.final_lens[label] = seq_id, prompt_tokens, final_len
            self.placed_lens[label] = prompt_tokens
        title = f"admit {label} ({prompt_tokens} tokens, final {final_len})"
        return self._record(title if result.admitted else f"{title}: refused", result.copies, not result.admitted)

    def append(self, *labels: str) -> PoolPicture:
        result = self.strategy.append([self.ids[label] for label in labels])
        for label in labels:
            self.lengths[label] += 1
        return self._record(f"append one token to {', '.join(labels)}", result.copies)

    def fork(self, parent: str, child: str) -> PoolPicture:
        seq_id = self._new_id()
        result = self.strategy.fork(self.ids[parent], seq_id)
        self.ids[child], self.lengths[child], self.final_lens[child] = seq_id, self.lengths[parent], \
            self.final_lens[parent]
        self.placed_lens[child] = self.lengths[parent]
        return self._record(f"fork {parent} -> {child}", result.copies)

    def free(self, label: str) -> PoolPicture:
        self.strategy.free(self.ids.pop(label))
        del self.lengths[label], self.final_lens[label], self.placed_lens[label]
        return self._record(f"free {label}", None)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _record(self, title: str, copies: np.ndarray | None, refused: bool = False) -> PoolPicture:
        picture = self._picture(title, copies, refused)
        self.pictures.append(picture)
        return picture

    def _picture(self, title: str, copies: np.ndarray | None, refused: bool) -> PoolPicture:
        s = self.strategy
        labels = list(self.ids)
        kinds = np.full(s.capacity_slots, FREE, dtype=np.int8)
        refcount = np.zeros(s.capacity_slots // self.draw_block_size, dtype=np.int32)
        seqs = []
        desc = s.describe([self.ids[label] for label in labels]) if labels else None
        for i, label in enumerate(labels):
            length, final_len = self.lengths[label], self.final_lens[label]
            if isinstance(desc, ContiguousDescriptor):
                start = int(desc.kv_start[i])
                # contiguous strategies reserve this much when they place a sequence
                extent = s.reservation_slots(final_len, self.placed_lens[label])
                slots = np.arange(start, start + extent)
                blocks = (start, start + extent - 1)
            else:
                table = desc.kv_indices[desc.kv_indptr[i]:desc.kv_indptr[i + 1]]
                np.add.at(refcount, table, 1)
                slots = (table[:, None] * s.block_size + np.arange(s.block_size)).ravel()
                blocks = tuple(int(b) for b in table)
            position = np.arange(slots.shape[0])
            kind = np.where(position < length, TOKEN, np.where(position < final_len, RESERVED, INTERNAL))
            np.maximum.at(kinds, slots, kind.astype(np.int8))
            written = s.slot_mapping(self.ids[label], 0, length)
            assert np.all(kinds[written] == TOKEN), f"{label}: slot_mapping points outside its blocks"
            seqs.append(SeqPicture(label, length, final_len, blocks))
        pairs = () if copies is None else tuple((int(a), int(b)) for a, b in np.asarray(copies).reshape(-1, 2))
        return PoolPicture(self.name, title, self.draw_block_size, s.kernel_mode == "paged", kinds, refcount,
                           tuple(seqs), pairs, refused)


def draw_pictures(pictures: list[PoolPicture], *, width_in: float = style.PAGE_WIDTH_IN) -> Figure:
    """Pictures side by side (e.g. the same operation on two strategies), one column each."""
    rows = max(len(p.seqs) for p in pictures) + 3  # sequences, a gap, the pool (two rows tall)
    with style.figure_style():
        fig, axes = style.new_figure(1, len(pictures), width_in=width_in, height_in=0.45 + 0.28 * rows,
                                     squeeze=False)
        for ax, picture in zip(axes[0], pictures, strict=True):
            _draw(ax, picture, rows)
        handles = [Rectangle((0, 0), 1, 1, facecolor=style.SLOT_STYLE[c][1], edgecolor="black", linewidth=0.4,
                             hatch=style.SLOT_STYLE[c][2], label=style.SLOT_STYLE[c][0])
                   for c in KIND_COLUMN.values()]
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, -0.06))
    return fig


def _slot_x(slot: int, bs: int) -> float:
    """x of a slot's cell in the pool row: block number plus the offset inside the block."""
    return slot // bs + (slot % bs) * 0.9 / bs


def _draw(ax, picture: PoolPicture, rows: int) -> None:
    bs = picture.block_size
    num_blocks = picture.kinds.shape[0] // bs
    ax.set_xlim(-2.2, num_blocks + 0.2)
    ax.set_ylim(-0.6, rows + 0.4)
    ax.axis("off")
    ax.set_title(f"{style.strategy_label(picture.strategy)}: {picture.title}", loc="left")
    header = "block table: physical block of each logical block" if picture.paged else "reserved extent"
    ax.text(0, rows - 0.1, header, va="bottom", fontsize=6, color="#555555")
    ax.text(-0.2, rows - 0.1, "tokens written/final", ha="right", va="bottom", fontsize=6, color="#555555")
    for i, seq in enumerate(picture.seqs):  # logical view, top down
        y = rows - 1 - i
        ax.text(-0.2, y + 0.4, f"{seq.label} ({seq.length}/{seq.final_len})", ha="right", va="center")
        if picture.paged:
            for j, block in enumerate(seq.blocks):  # logical block j -> physical block
                ax.add_patch(Rectangle((j, y), 0.9, 0.8, facecolor="white", edgecolor="black", linewidth=0.5))
                ax.text(j + 0.45, y + 0.4, f"{block}", ha="center", va="center", fontsize=6)
        else:  # the extent, drawn straight above the slots it occupies in the pool
            first, last = seq.blocks
            x0, x1 = _slot_x(first, bs), _slot_x(last, bs) + 0.9 / bs
            ax.add_patch(Rectangle((x0, y), x1 - x0, 0.8, facecolor="white", edgecolor="black", linewidth=0.5))
            ax.text((x0 + x1) / 2, y + 0.4, f"slots {first}-{last}", ha="center", va="center", fontsize=6)
    ax.text(-0.2, 0.8, "physical\nblocks", ha="right", va="center")
    for b in range(num_blocks):  # physical view: one box per block, one cell per slot
        for offset in range(bs):
            column = KIND_COLUMN[int(picture.kinds[b * bs + offset])]
            _, color, hatch = style.SLOT_STYLE[column]
            ax.add_patch(Rectangle((_slot_x(b * bs + offset, bs), 0.3), 0.9 / bs, 1.0, facecolor=color, hatch=hatch,
                                   edgecolor="black", linewidth=0.2))
        ax.add_patch(Rectangle((b, 0.3), 0.9, 1.0, fill=False, edgecolor="black", linewidth=0.6))
        ax.text(b + 0.45, 0.0, f"{b}", ha="center", va="center", fontsize=6)
        if picture.paged and picture.refcount[b]:  # reference count: sequences whose table holds the block
            ax.text(b + 0.45, 1.5, f"rc{picture.refcount[b]}", ha="center", va="center", fontsize=5.5)
    notes = [f"copy block {a} -> {b}" for a, b in picture.copies] if picture.paged else \
        [f"copy slots {a} -> {b}" for a, b in picture.copies[:1]] + (["..."] if len(picture.copies) > 1 else [])
    if notes:
        ax.text(num_blocks, rows - 1.4, "; ".join(notes), ha="right", va="center", fontsize=6, color="#D55E00")
