"""The scheduler's verdicts (workbench.engine.rules) on enumerated grids, as plain Python and compiled
(workbench.engine.compiled_rules): each agrees with its definition written out here, in both forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workbench.engine import compiled_rules
from workbench.engine import rules as python_rules


@pytest.fixture(params=["python", "compiled"])
def rules(request):
    return python_rules if request.param == "python" else compiled_rules


def test_every_rule_is_compiled_from_itself():
    from numba.core.registry import CPUDispatcher

    names = [n for n, f in vars(python_rules).items() if callable(f) and getattr(f, "__module__", "") ==
             python_rules.__name__]
    assert names and all(isinstance(getattr(compiled_rules, n), CPUDispatcher) for n in names)
    assert all(getattr(compiled_rules, n).py_func is getattr(python_rules, n) for n in names)


def test_arrival_rejects_exactly_what_exceeds_the_model_length(rules):
    for prompt, output, max_len in itertools.product(range(0, 6), range(1, 6), range(1, 10)):
        assert rules.too_long(prompt, output, max_len) == (prompt + output > max_len)


def test_blocks_needed_covers_the_tokens_and_one_copy_per_further_sequence(rules):
    for tokens, block_size, num_seqs in itertools.product(range(0, 40), (1, 2, 16), (1, 2, 4)):
        need = rules.blocks_needed(tokens, block_size, num_seqs)
        assert (need - num_seqs + 1) * block_size >= tokens > (need - num_seqs) * block_size or tokens == 0


@pytest.mark.parametrize("spends_budget", [True, False])
def test_admission_verdict_grid(rules, spends_budget):
    for tokens, budget, running, num_seqs, needed, free, watermark in itertools.product(
            (0, 5, 8), (0, 5, 8), (0, 3), (1, 2), (1, 4), (0, 4, 10), (0, 2)):
        verdict = rules.admission_verdict(tokens, budget, spends_budget, running, num_seqs, 4, needed, free, watermark)
        over = (spends_budget and (tokens > budget or budget == 0)) or running + num_seqs > 4
        below = watermark > 0 and free - needed < watermark
        assert verdict == (rules.STOP if over else rules.BELOW_WATERMARK if below else rules.PLACE)


def test_the_victim_is_the_latest_arrived_holder(rules):
    rng = np.random.default_rng(0)
    for n in range(1, 30):
        order = rng.permutation(1000)[:n].astype(np.int64)
        assert order[rules.victim(order)] == order.max()


def test_a_refusal_is_final_only_on_an_empty_device(rules):
    assert rules.refusal_is_final(0) and not rules.refusal_is_final(1)


def test_only_a_lone_holder_is_retired_and_a_step_that_preempted_admits_nothing(rules):
    assert [rules.retires_victim(n) for n in (1, 2, 7)] == [True, False, False]
    assert [rules.admits_after(p) for p in (0, 1, 3)] == [True, False, False]


def test_a_static_batch_admits_only_into_an_empty_engine(rules):
    for static, running in itertools.product((False, True), (0, 1, 5)):
        assert rules.admits_now(static, running) == (not static or running == 0)


def test_step_verdict(rules):
    for computing, started, rejected in itertools.product((0, 3), (0, 1), (0, 2)):
        expected = rules.RUN if computing or started else rules.IDLE if rejected else rules.STUCK
        assert rules.step_verdict(computing, started, rejected) == expected


def test_recompute_and_tokens_left(rules):
    assert rules.recompute_tokens(100, 7) == 107
    assert rules.final_kv_len(100, 7) == 106
    assert rules.tokens_left(10, 10) == 0 and rules.tokens_left(10, 3) == 7


def test_the_next_event_is_now_with_work_else_the_next_arrival_never_earlier(rules):
    for now, ready, arrival in itertools.product((0.0, 1.5, 3.0), (True, False), (0.5, 1.5, 2.0, math.inf)):
        expected = now if ready else max(now, arrival)
        assert rules.next_event_s(now, ready, arrival) == expected


def test_a_first_time_is_kept_and_only_nan_takes_now(rules):
    assert math.isnan(rules.first_time(math.nan, math.nan))
    assert rules.first_time(math.nan, 2.5) == 2.5
    assert rules.first_time(1.0, 2.5) == 1.0
    assert rules.first_time(0.0, 2.5) == 0.0
