"""The beam-search fork/prune process: pure, well-formed, and sharing ancestry as beam search does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.workload import Request, Segment
from workbench.workload.beam import beam_step


def _beam_request(width, output=64, request_id=3):
    return Request(request_id, 0.0, 10, output, (Segment(1, 10),), beam_width=width)


@settings(max_examples=50, deadline=None)
@given(width=st.integers(2, 8), step=st.integers(0, 63), seed=st.integers(0, 2**63))
def test_each_step_is_well_formed(width, step, seed):
    request = _beam_request(width)
    result = beam_step(request, step, seed)
    assert result == beam_step(request, step, seed)
    live = 1 if step == 0 else width
    assert len(result.parents) == len(result.token_ids) == width
    assert all(0 <= p < live for p in result.parents)
    assert set(result.freed) == set(range(live)) - set(result.parents)
    if step > 0:  # the beam count stays at width: every freed beam is replaced by one extra fork
        assert len(result.freed) == width - len(set(result.parents))


def test_first_step_forks_the_prompt():
    result = beam_step(_beam_request(4), 0, seed=0)
    assert result.parents == (0, 0, 0, 0) and result.freed == ()
    assert len(set(result.token_ids)) == 4


def test_seed_and_request_change_the_process():
    runs = {tuple(beam_step(_beam_request(4, request_id=r), s, seed).parents for s in range(1, 30))
            for r in (1, 2) for seed in (0, 1)}
    assert len(runs) == 4


def test_lineages_coalesce():
    """Tracing the final beams back, they share an ancestor well before the start (real prefix sharing)."""
    width, steps = 4, 64
    request = _beam_request(width, output=steps)
    lineage = set(range(width))
    for step in range(steps - 1, 0, -1):
        parents = beam_step(request, step, seed=5).parents
        lineage = {parents[b] for b in lineage}
        if len(lineage) == 1:
            break
    assert len(lineage) == 1 and step > 1


@pytest.mark.parametrize("width,step", [(1, 0), (4, 64), (4, -1)])
def test_rejects_non_beam_requests_and_bad_steps(width, step):
    with pytest.raises(ValueError):
        beam_step(_beam_request(width), step, seed=0)


def test_branch_frac_one_is_the_default_process():
    request = _beam_request(4)
    assert all(beam_step(request, s, 7, 1.0) == beam_step(request, s, 7) for s in range(64))


@pytest.mark.parametrize("frac", [0.0, 0.3])
def test_steps_that_do_not_branch_extend_every_beam(frac):
    """Outside branch points no beam forks or is freed; with frac 0 no step after the first branches,
    and the branch points of a smaller frac are a subset of those of a larger one (one draw per step)."""
    request = _beam_request(4)
    steps = [beam_step(request, s, 5, frac) for s in range(1, 64)]
    still = [r.parents == (0, 1, 2, 3) and r.freed == () for r in steps]
    full = [beam_step(request, s, 5) for s in range(1, 64)]
    assert sum(still) >= (63 if frac == 0.0 else 63 * (1 - frac) / 2)
    for r, f, same in zip(steps, full, still, strict=True):
        assert same or r == f  # a branch point is the default process's step


def _coalesce_step(frac, width=4, steps=64):
    """The step at which the final beams' lineages meet (0 when only the prompt is shared)."""
    request = _beam_request(width, output=steps)
    lineage = set(range(width))
    for step in range(steps - 1, 0, -1):
        lineage = {beam_step(request, step, 5, frac).parents[b] for b in lineage}
        if len(lineage) == 1:
            return step
    return 0


def test_fewer_branch_points_push_the_common_ancestor_back():
    assert _coalesce_step(0.0) == 0 < _coalesce_step(0.3) < _coalesce_step(1.0)
