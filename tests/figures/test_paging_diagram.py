"""The paging diagram reads a real strategy through the protocol: its picture of every slot agrees with the
strategy's own snapshot after every operation, for every registered strategy, and the drawing shows it."""

from __future__ import annotations

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pytest

from workbench.allocators import registry
from workbench.figures import style
from workbench.figures.paging_diagram import PagingWalk, draw_pictures, drawable

# admit two, decode, fork a sample off A, decode both (copy-on-write of a shared partial block), free one
WALK = [("admit", "A", 6, 11), ("admit", "B", 3, 5), ("append", "A", "B"), ("fork", "A", "C"),
        ("append", "A", "C"), ("free", "B"), ("admit", "D", 9, 14)]


def walk(name: str) -> PagingWalk:
    w = PagingWalk(name, capacity_slots=64, block_size=4, max_model_len=16)
    for op, *args in WALK:
        picture = getattr(w, op)(*args)
        snap = w.strategy.snapshot()
        counts = picture.counts()
        assert counts["token_slots"] == snap.token_slots, (name, picture.title)
        assert counts["reserved_slots"] == snap.reserved_slots, (name, picture.title)
        assert counts["internal_frag_slots"] == snap.internal_frag_slots, (name, picture.title)
        assert counts["free_slots"] == snap.free_slots + snap.cached_slots + snap.external_frag_slots
        assert [s.label for s in picture.seqs] == list(w.ids)
    return w


def picturable(name: str) -> bool:
    return drawable(registry.create(name, capacity_slots=1 << 16, block_size=4, max_model_len=16))  # room for any page


@pytest.mark.parametrize("name", [n for n in registry.names() if picturable(n)])
def test_every_picture_agrees_with_the_snapshot(name):
    pictures = walk(name).pictures
    assert len(pictures) == len(WALK) and not any(p.refused for p in pictures)
    lengths = {s.label: s.length for s in pictures[-1].seqs}
    assert lengths == {"A": 8, "C": 8, "D": 9}


def test_paged_fork_shares_blocks_and_a_write_copies_the_shared_partial_block():
    pictures = walk("paged").pictures
    fork, cow = pictures[3], pictures[4]
    a, c = (next(s for s in fork.seqs if s.label == x) for x in "AC")
    assert a.blocks == c.blocks and all(fork.refcount[b] == 2 for b in a.blocks)
    assert len(cow.copies) == 1 and cow.copies[0][0] == a.blocks[1]  # the partial block, copied once
    a, c = (next(s for s in cow.seqs if s.label == x) for x in "AC")
    assert a.blocks[0] == c.blocks[0] and a.blocks[1] != c.blocks[1] and cow.refcount[a.blocks[0]] == 2


def test_contiguous_max_reserves_max_model_len_per_sequence():
    picture = walk("contiguous-max").pictures[1]
    assert [s.blocks[1] - s.blocks[0] + 1 for s in picture.seqs] == [16, 16]
    assert picture.counts()["internal_frag_slots"] == (16 - 11) + (16 - 5)


def test_the_drawing_colors_each_slot_by_its_kind():
    pictures = [walk(name).pictures[4] for name in ("contiguous-max", "paged")]
    fig = draw_pictures(pictures)
    for ax, picture in zip(fig.axes, pictures, strict=True):
        cells = [p for p in ax.patches if p.get_height() == 1.0 and p.get_fill()]  # pool cells
        assert len(cells) == picture.kinds.shape[0]
        for column, count in picture.counts().items():
            color = mcolors.to_rgba(style.SLOT_STYLE[column][1])
            assert sum(np.allclose(p.get_facecolor(), color) for p in cells) == count, column
    plt.close(fig)


def test_virtual_memory_is_refused_with_a_reason():
    for name in [n for n in registry.names() if not picturable(n)]:
        with pytest.raises(ValueError, match="addresses virtual memory"):
            PagingWalk(name, capacity_slots=1 << 16, block_size=4, max_model_len=16)
