"""`fewer_collections` restores the collector as it found it."""

from __future__ import annotations

import gc

from workbench.engine.gc_pause import GEN0_ALLOCATIONS, fewer_collections


def test_settings_come_back_after_the_loop():
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold()[0] >= GEN0_ALLOCATIONS and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_callers_frozen_objects_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with fewer_collections():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
