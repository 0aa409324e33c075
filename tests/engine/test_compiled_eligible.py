"""Which runs take the compiled loop (workbench.engine.compiled_paged.eligible): every config field and clock
attribute is classified, an unclassified one sends a run to the general loop, and the golden cases give their
recorded tables through both loops."""

from __future__ import annotations

import dataclasses

import pytest

import workbench as wb
from tests.engine.conftest import small_config
from tests.engine.golden import WORKLOADS, load, outputs_of
from tests.engine.test_compiled_paged import count_drives
from workbench import columns as C
from workbench.allocators import registry
from workbench.clock.roofline import FORMULA_CONSTANTS
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.compiled_paged import eligible
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.simulation import make_replica
from workbench.workload import build_workload

PLAIN = dict(strategy="paged", model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512",
             kv_slots=2048, kernel="none", workload="alpaca-like", num_requests=8)


def replica_of(cfg: RunConfig):
    res = cfg.resolve()
    return make_replica(cfg, res, registry.create_from_config(cfg, res), build_workload(cfg), "none")


def test_every_field_and_clock_attribute_is_classified_once():
    replica = replica_of(RunConfig(**PLAIN))
    assert eligible.unclassified(RunConfig(**PLAIN), replica.scheduler.config, replica.clock) == []
    for handled, neutral, fields in ((eligible.RUN_HANDLED, eligible.RUN_NEUTRAL, dataclasses.fields(RunConfig)),
                                     (eligible.SCHEDULER_HANDLED, eligible.SCHEDULER_NEUTRAL,
                                      dataclasses.fields(SchedulerConfig))):
        names = {f.name for f in fields}
        assert not set(handled) & set(neutral)
        assert set(handled) | set(neutral) == names, "a list names a field that does not exist"
    clock_names = set(vars(replica.clock))
    assert not set(eligible.CLOCK_HANDLED) & FORMULA_CONSTANTS
    assert set(eligible.CLOCK_HANDLED) | set(eligible.CLOCK_NEUTRAL) | FORMULA_CONSTANTS == clock_names


def test_a_new_config_field_sends_the_run_to_the_general_loop_until_classified():
    base = RunConfig(**PLAIN)
    replica = replica_of(base)
    assert eligible.applies(replica, base)
    extended = dataclasses.make_dataclass("ExtendedRunConfig", [("new_knob", "int", dataclasses.field(default=0))],
                                          bases=(RunConfig,), frozen=True)
    cfg = extended(**PLAIN)
    assert eligible.unclassified(cfg, replica.scheduler.config, replica.clock) == ["RunConfig.new_knob"]
    assert not eligible.applies(replica, cfg)


def test_a_new_clock_attribute_sends_the_run_to_the_general_loop():
    replica = replica_of(RunConfig(**PLAIN))
    replica.clock.new_term_s = 0.0
    assert eligible.unclassified(None, replica.scheduler.config, replica.clock) == ["RooflineClock.new_term_s"]
    assert not eligible.applies(replica)


@pytest.mark.parametrize("name", sorted(eligible.RUN_NEUTRAL))
def test_each_neutral_field_at_another_value_sends_the_run_to_the_general_loop(name):
    cfg = RunConfig(**PLAIN)
    replica = replica_of(cfg)
    object.__setattr__(cfg, name, object())  # any value but the neutral one
    assert eligible.not_neutral(cfg, replica.scheduler.config, replica.clock) == [f"RunConfig.{name}"]
    assert not eligible.applies(replica, cfg)


@pytest.mark.parametrize("name", sorted(eligible.SCHEDULER_NEUTRAL))
def test_each_neutral_scheduler_field_at_another_value_sends_the_run_to_the_general_loop(name):
    replica = replica_of(RunConfig(**PLAIN))
    sched = replica.scheduler
    sched.config = dataclasses.replace(sched.config, **{name: object()})
    assert eligible.not_neutral(None, sched.config, replica.clock) == [f"SchedulerConfig.{name}"]
    assert not eligible.applies(replica)


GOLDEN = load()


@pytest.mark.parametrize("strategy", ["paged", "paged-prefix", "virtual-contiguous"])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_golden_cases_give_their_recorded_tables_through_both_loops(workload, strategy, monkeypatch):
    """The golden runs verify the kernel, which the compiled loop does not run; without it the tables are the
    recorded ones (the kernel changes no scheduling), through the compiled loop where it applies and through
    the general loop always."""
    cfg = small_config(strategy=strategy, **{**WORKLOADS[workload], "kernel": "none", "verify_every": 0})
    expected = GOLDEN[strategy][workload]
    taken = count_drives(monkeypatch)
    for enabled in (True, False):
        monkeypatch.setattr(eligible, "ENABLED", enabled)
        got = outputs_of(simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve())))
        assert (got["steps_sha256"], got["requests_sha256"]) == (expected["steps_sha256"], expected["requests_sha256"])
        differing = {k for k, v in expected["summary"].items() if got["summary"].get(k) != v}
        assert differing <= {"kernel_backend", *C.KERNEL_NUMERIC_KEYS}
    plain = WORKLOADS[workload].get("preemption", "recompute") == "recompute" and \
        WORKLOADS[workload].get("n", 1) == 1 and WORKLOADS[workload].get("beam_width", 1) == 1
    assert taken == ([1] if plain else [])


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_run_resolves_its_config_once(monkeypatch, tmp_path, replicas):
    """The resolved sizes are computed once and handed down (check, strategies, replicas, clock)."""
    from workbench.engine import simulation

    calls = []
    resolve = RunConfig.resolve
    monkeypatch.setattr(RunConfig, "resolve", lambda self: calls.append(1) or resolve(self))
    cfg = RunConfig(**{**PLAIN, "replicas": replicas})
    simulation.run_in_memory(cfg)
    simulation.run(cfg, tmp_path / "out")
    assert len(calls) == 2
    wb.run(**{**PLAIN, "replicas": replicas})  # checked before any work, and run with what the check resolved
    assert len(calls) == 3
