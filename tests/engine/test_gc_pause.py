"""`fewer_collections` restores the collector as it found it."""

from __future__ import annotations

import gc

from workbench.engine.gc_pause import GEN0_ALLOCATIONS, fewer_collections


def test_settings_come_back_after_the_loop():
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold()[0] >= GEN0_ALLOCATIONS and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_callers_frozen_objects_stay_frozen(monkeypatch):
    # Counting frozen objects before and after would race with objects freed meanwhile; what matters
    # is that the context neither freezes nor unfreezes when the caller has frozen objects.
    gc.freeze()
    try:
        calls = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        before = gc.get_threshold()
        with fewer_collections():
            assert gc.get_threshold()[0] >= GEN0_ALLOCATIONS
        assert calls == [] and gc.get_threshold() == before
    finally:
        monkeypatch.undo()
        gc.unfreeze()
