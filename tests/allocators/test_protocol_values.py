"""The protocol's value types: each field holds what was given for it, and the checked ones refuse what
their docstrings rule out (they are NamedTuples whose `__new__` lists the fields a second time)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators.values import AdmitResult, AppendResult, SeqSpec, Snapshot

PARTS = ("token_slots", "reserved_slots", "internal_frag_slots", "cached_slots", "external_frag_slots", "free_slots",
         "state_slots", "state_checkpoint_slots")


def _snapshot_fields() -> dict:
    parts = dict(zip(PARTS, (11, 7, 5, 3, 2, 72, 29, 31), strict=True))
    six, state = dict(list(parts.items())[:6]), dict(list(parts.items())[6:])
    return dict(capacity_slots=sum(parts.values()), **six, logical_token_slots=13, block_table_bytes=17,
                largest_free_extent_slots=19, num_free_blocks=23, groups=(), **state)


def test_snapshot_fields_hold_what_was_given_by_name_and_by_position():
    fields = _snapshot_fields()
    assert Snapshot._fields == tuple(fields)
    for snap in (Snapshot(**fields), Snapshot(*fields.values())):
        assert {name: getattr(snap, name) for name in Snapshot._fields} == fields


@pytest.mark.parametrize("part", PARTS)
def test_snapshot_refuses_a_broken_partition(part):
    fields = _snapshot_fields()
    with pytest.raises(AssertionError, match="slot accounting broken"):
        Snapshot(**{**fields, part: fields[part] + 1})  # the parts no longer sum to the capacity
    moved = {**fields, part: -1, "free_slots": fields["free_slots"] + fields[part] + 1}
    if part != "free_slots":
        with pytest.raises(AssertionError, match="slot accounting broken"):
            Snapshot(**moved)  # the right sum, one part negative


def test_seq_spec_takes_its_count_from_the_token_ids_and_checks_the_rest():
    spec = SeqSpec(np.arange(5, dtype=np.int32), 9, num_new_tokens=2)
    assert (spec.num_tokens, spec.final_len, spec.num_new_tokens, spec.num_held(0), spec.num_held(4)) == (5, 9, 2, 2, 5)
    assert SeqSpec(None, 9, num_tokens=4).num_held(0) == 4
    with pytest.raises(ValueError, match="needs num_tokens"):
        SeqSpec(None, 9)
    with pytest.raises(ValueError, match="num_new_tokens must be >= 1"):
        SeqSpec(None, 9, num_new_tokens=0, num_tokens=4)


def test_results_default_and_name_their_fields():
    assert AdmitResult(False, reason="full") == (False, 0, None, 0, "full")
    slots, copies = np.arange(3), np.zeros((0, 2), dtype=np.int32)
    appended = AppendResult(slots=slots, copies=copies)
    assert appended.slots_of_group(1) is slots and appended.group_slots is None
