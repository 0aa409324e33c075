"""One simulation run (docs/engine.md): the only place that wires workload, strategy, KV pool and kernels.

`run(cfg, out_dir)` replays the workload step by step: arrivals join the queue, the scheduler
allocates the step's work on the strategy, the kernel runner (unless `kernel = none`) executes the
block moves, cache writes and attention and verifies sampled sequences, the clock advances by the
step's modeled (or measured) duration, and one step row is recorded. Idle gaps jump to the next
arrival. Same config and seed give bit-identical tables.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench import table_sink
from workbench.allocators import registry
from workbench.allocators.base import Strategy
from workbench.clock.profiles import make_clock
from workbench.code_version import code_version
from workbench.config import DRAFT_KV_LAYERS, Resolved, RunConfig
from workbench.engine.compiled_paged import drive as compiled_drive
from workbench.engine.compiled_paged import eligible as compiled_eligible
from workbench.engine.gc_pause import fewer_collections
from workbench.engine.replica import Replica, StepTimers
from workbench.engine.scheduler import Scheduler
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.summary_counters import summary_counters
from workbench.engine.tokens import TokenStore
from workbench.errors import ConfigError, UnservableError
from workbench.fleet import disaggregated, fleet
from workbench.fleet.registry import make_router
from workbench.heap import release_free_memory
from workbench.outdir import OutputExistsError, install, staging_dir
from workbench.results import REQUESTS_TABLE, STEPS_TABLE, summarize_chunks, write_json, write_outputs
from workbench.table_sink import MemorySink, ParquetSink, TableSink
from workbench.workload import build_workload, check_workload
from workbench.workload.request import Request, RequestColumns, failed_rows_dropped, shortest_request


@dataclass(frozen=True)
class RunResult:
    steps: pd.DataFrame  # steps.parquet
    requests: pd.DataFrame  # requests.parquet
    summary: dict[str, Any]  # summary.json


def kernel_backend(cfg: RunConfig) -> str:
    if cfg.kernel == "auto":
        from workbench.kernels import default_backend
        return default_backend()
    return cfg.kernel


def check_config(cfg: RunConfig) -> Resolved:
    """Everything that can be said against a config before running it; raises ValueError."""
    if cfg.strategy not in registry.names():
        raise ValueError(f"unknown strategy {cfg.strategy!r}; valid: {', '.join(registry.names())}")
    resolved = cfg.resolve()
    check_workload(cfg)
    registry.check_strategy(cfg, resolved)
    if cfg.kernel == "cupy":
        from workbench.kernels import available_backends
        if "cupy" not in available_backends():
            raise ValueError("kernel cupy needs a CUDA GPU with CuPy; use --kernel numba or auto")
    return resolved


def run(cfg: RunConfig, out_dir: Path | None = None, *, progress: bool = False) -> dict[str, Any]:
    """Run one simulation; with `out_dir`, write config.json, steps.parquet, requests.parquet and
    summary.json there. Returns the summary (keys = columns.SUMMARY_KEYS).

    One replica's tables stream to Parquet while it runs (a temporary directory without `out_dir`), so
    its memory does not grow with the trace; `out_dir` appears only once complete (workbench.outdir),
    and nothing is left of it after an error."""
    wall0, res, requests = _prepared(cfg)
    release_free_memory()  # the workload's transient arrays: the run's peak is then the simulation's
    shared_tier = registry.create_shared_tier(cfg, res)  # one pool for every replica (None: no shared tier)
    result = _simulate_fleet(cfg, res, requests, shared_tier, progress=progress, wall0_s=wall0)
    if result is not None:
        if out_dir is not None:
            write_outputs(Path(out_dir), run_description(cfg, res, result.summary["kernel_backend"]), result.steps,
                          result.requests, result.summary)
        return result.summary
    final = None if out_dir is None else Path(out_dir)
    staged = Path(tempfile.mkdtemp(prefix="workbench-run-")) if final is None else staging_dir(final)
    keep = False  # a refused install keeps the new files where its message says; anything else leaves nothing
    try:
        staged.mkdir(parents=True, exist_ok=final is None)
        handed = [requests]  # the only reference goes to simulate_into, which lets go before the summary
        del requests
        summary = simulate_into(cfg, handed.pop(), registry.create_from_config(cfg, res, shared_tier),
                                ParquetSink(staged), progress=progress, wall0_s=wall0, res=res)
        if final is not None:
            write_json(staged / "config.json", run_description(cfg, res, summary["kernel_backend"]))
            write_json(staged / "summary.json", summary)
            try:
                install(staged, final, replace=False)
            except OutputExistsError:
                keep = True
                raise
    finally:
        if not keep:
            shutil.rmtree(staged, ignore_errors=True)
    return summary


def run_in_memory(cfg: RunConfig, *, progress: bool = False, res: Resolved | None = None
                  ) -> tuple[RunResult, dict[str, Any]]:
    """Run one simulation, keeping its tables in memory (`workbench.run`): the tables and summary, and
    config.json's contents (`run_description`). `run` streams them to files instead. `res`: what `check_config`
    returned for `cfg`, when the caller checked it already."""
    wall0, res, requests = _prepared(cfg, res)
    shared_tier = registry.create_shared_tier(cfg, res)  # one pool for every replica (None: no shared tier)
    result = _simulate_fleet(cfg, res, requests, shared_tier, progress=progress, wall0_s=wall0)
    if result is None:
        result = simulate(cfg, requests, registry.create_from_config(cfg, res, shared_tier), progress=progress,
                          wall0_s=wall0, res=res)
    return result, run_description(cfg, res, result.summary["kernel_backend"])


def _prepared(cfg: RunConfig, res: Resolved | None = None) -> tuple[float, Resolved, Sequence[Request]]:
    """(wall clock at the start, the resolved sizes, the workload), every check passed before simulating (the
    config's own: `check_config`, unless its result `res` is given)."""
    wall0 = time.perf_counter()
    res = check_config(cfg) if res is None else res
    requests = build_workload(cfg)
    check_accepted(cfg, requests)
    check_servable(cfg, res, requests)
    return wall0, res, requests


def _simulate_fleet(cfg: RunConfig, res: Resolved, requests: Sequence[Request], shared_tier, *, progress: bool,
                    wall0_s: float) -> RunResult | None:
    """A disaggregated or colocated fleet's run, in memory; None for a single replica."""
    if cfg.prefill_replicas:
        strategies = [registry.create_from_config(cfg, res) for _ in range(cfg.num_engines)]
        return simulate_disaggregated(cfg, requests, strategies, progress=progress, wall0_s=wall0_s, res=res)
    if cfg.replicas > 1:
        strategies = [registry.create_from_config(cfg, res, shared_tier) for _ in range(cfg.replicas)]
        return simulate_fleet(cfg, requests, strategies, progress=progress, wall0_s=wall0_s, res=res)
    return None


def simulate(cfg: RunConfig, requests: Sequence[Request], strategy: Strategy, *, progress: bool = False,
             timers: StepTimers | None = None, wall0_s: float | None = None, res: Resolved | None = None
             ) -> RunResult:
    """Replay `requests` on a fresh `strategy` (mutated) under `cfg`; returns the tables and summary. `res`:
    `cfg.resolve()`, when the caller has it already (resolved once per run)."""
    sink = MemorySink()
    summary = simulate_into(cfg, requests, strategy, sink, progress=progress, timers=timers, wall0_s=wall0_s,
                            res=res)
    return RunResult(sink.frame(STEPS_TABLE), sink.frame(REQUESTS_TABLE), summary)


def simulate_into(cfg: RunConfig, requests: Sequence[Request], strategy: Strategy, sink: TableSink, *,
                  progress: bool = False, timers: StepTimers | None = None, wall0_s: float | None = None,
                  res: Resolved | None = None) -> dict[str, Any]:
    """`simulate`, its step and request tables handed to `sink` in chunks while it runs (then closed);
    returns the summary, computed from the sink's tables. Holds `requests` only until the tables are
    written."""
    wall0_s = time.perf_counter() if wall0_s is None else wall0_s
    res = cfg.resolve() if res is None else res
    backend = kernel_backend(cfg)
    replica = make_replica(cfg, res, strategy, requests, backend, timers=timers, sink=sink)
    dropped = failed_rows_dropped(requests)
    try:
        with fewer_collections():
            if compiled_eligible.applies(replica, cfg):
                compiled_drive.drive(replica, progress, sink)
            else:
                _drive(replica, progress, sink)
    finally:  # a GPU run's virtual memory goes back now, not when the process ends
        replica.close()
    replica.steps.close()
    sink.close()
    # every row is written: the workload's columns (16-24 bytes a request) go before the summary, unless the
    # caller keeps them, and so do the engine's freed state
    del requests
    replica.scheduler.arrivals.release()
    release_free_memory()
    log = replica.scheduler.log
    return summarize_chunks(lambda columns: sink.chunks(STEPS_TABLE, columns),
                            lambda columns: sink.chunks(REQUESTS_TABLE, columns),
                            capacity_slots=strategy.capacity_slots, generated_tokens=log.generated_tokens,
                            extra={**replica_extra(res, replica, backend), "num_failed_rows_dropped": dropped,
                                   "sim_wall_s": time.perf_counter() - wall0_s})


def simulate_fleet(cfg: RunConfig, requests: list[Request], strategies: list[Strategy], *, progress: bool = False,
                   wall0_s: float | None = None, res: Resolved | None = None) -> RunResult:
    """Replay `requests` on one replica per strategy (each fresh, mutated) behind `cfg.router`
    (docs/fleet.md). Returns the fleet's tables (a `replica` column in both) and summary. With a shared
    tier, every strategy holds the same one (`registry.create_shared_tier`), and so do the kernel pools."""
    wall0_s = time.perf_counter() if wall0_s is None else wall0_s
    res = cfg.resolve() if res is None else res
    backend = kernel_backend(cfg)
    if len({id(s.shared_tier) for s in strategies}) > 1:
        raise ValueError("the replicas of a fleet hold different shared tiers: build one "
                         "(registry.create_shared_tier) and hand it to every replica's strategy")
    shared_kv = shared_kv_of(cfg, res, strategies[0], backend)
    members = [fleet.Member(make_replica(cfg, res, s, [], backend, shared_kv=shared_kv)) for s in strategies]
    router = make_router(cfg.router, len(members), block_size=strategies[0].block_size, seed=cfg.seed,
                         overlap_weight=cfg.kv_overlap_weight)
    try:
        with fewer_collections():
            placed, imbalance = fleet.drive(members, router, requests, progress)
    finally:
        for m in members:
            m.replica.close()
    extras = [replica_extra(res, m.replica, backend) for m in members]
    return RunResult(*fleet.merge(cfg, members, requests, placed, imbalance, extras, time.perf_counter() - wall0_s))


def simulate_disaggregated(cfg: RunConfig, requests: list[Request], strategies: list[Strategy], *,
                           progress: bool = False, wall0_s: float | None = None, res: Resolved | None = None
                           ) -> RunResult:
    """Replay `requests` on `cfg.prefill_replicas` prefill replicas behind `cfg.router` and decode replicas
    after them, one per strategy (each fresh, mutated; prefill first), the KV of each prompt shipped from its
    prefill replica's NIC port to its decode replica's (docs/fleet.md). Returns the fleet's tables (one row
    per request) and summary."""
    wall0_s = time.perf_counter() if wall0_s is None else wall0_s
    res = cfg.resolve() if res is None else res
    backend = kernel_backend(cfg)
    num_prefill = cfg.prefill_replicas
    if not 0 < num_prefill < len(strategies):
        raise ValueError(f"{len(strategies)} strategies for {num_prefill} prefill replicas: at least one decode "
                         f"replica must follow them")
    members = [fleet.Member(make_replica(cfg, res, s, [], backend)) for s in strategies]
    router = make_router(cfg.router, num_prefill, block_size=strategies[0].block_size, seed=cfg.seed,
                         overlap_weight=cfg.kv_overlap_weight)
    loop = disaggregated.Disaggregated(members[:num_prefill], members[num_prefill:], router, requests,
                                       kv_bytes_per_token=res.kv_bytes_per_token, kv_link_gb_s=cfg.kv_link_gb_s)
    try:
        with fewer_collections():
            flow = loop.run(progress)
    finally:
        for m in members:
            m.replica.close()
    extras = [replica_extra(res, m.replica, backend) for m in members]
    return RunResult(*disaggregated.merge(cfg, members[:num_prefill], members[num_prefill:], requests, flow, extras,
                                          time.perf_counter() - wall0_s))


def shared_kv_of(cfg: RunConfig, res: Resolved, strategy: Strategy, backend: str):
    """The K and V arrays of `strategy`'s shared tier for the kernel pools (None without a shared tier or a kernel)."""
    if backend == "none" or not strategy.shared_tier_blocks:
        return None
    from workbench.engine.kvpool import shared_tier_arrays
    return shared_tier_arrays(strategy.shared_tier_blocks * strategy.block_size, res.kernel_heads,
                              res.kernel_head_dim, cfg.kv_dtype)


def make_replica(cfg: RunConfig, res: Resolved, strategy: Strategy, requests: Sequence[Request], backend: str, *,
                 timers: StepTimers | None = None, shared_kv=None, sink: TableSink | None = None) -> Replica:
    """One replica serving `requests` (a list it may be handed more of later, in arrival order) on a fresh
    `strategy`, with its own token store, kernel runner (unless `backend` is none) and clock. `shared_kv`:
    the K and V of the fleet's shared tier (`shared_kv_of`), the same for every replica; a replica whose
    strategy has a shared tier builds them without (a fleet of one)."""
    tokens = TokenStore()
    sched = make_scheduler(cfg, res, strategy, requests, tokens, kernel_every=None if backend == "none"
                           else cfg.kernel_every)
    runner = None
    if backend != "none":
        from workbench.engine.kvpool import KVPool
        from workbench.engine.latent import latent_kernel
        from workbench.engine.runner import KernelRunner
        pool_class, paging = KVPool, {}
        if strategy.page_tokens:  # pages mapped on demand: CUDA virtual memory, emulated on the CPU
            from workbench.engine.kvpool_vmm import VirtualKVPool as pool_class
            paging = {"page_rows": strategy.page_tokens}
        if shared_kv is None:
            shared_kv = shared_kv_of(cfg, res, strategy, backend)
        pool = pool_class(strategy.virtual_slots, res.swap_slots, res.kernel_heads, res.kernel_head_dim, cfg.kv_dtype,
                          backend, tier_slots=strategy.host_tier_blocks * strategy.block_size, shared_kv=shared_kv,
                          **paging)
        group_size = res.model.num_heads // res.model.num_kv_heads
        runner = KernelRunner(pool, tokens, block_size=strategy.block_size, num_q_heads=res.kernel_heads * group_size,
                              head_dim=res.model.head_dim, seed=cfg.seed, verify_every=cfg.verify_every,
                              latent=latent_kernel(res.model))
    clock = make_clock(cfg, res, strategy.block_size, strategy.map_s_per_page, strategy.overlap_map,
                       paged_kernel=strategy.kernel_reads_blocks, overlap_load=strategy.overlap_load,
                       shared_link_gb_s=strategy.shared_link_gb_s if strategy.shared_tier_blocks else 0.0)
    # measured attention of one layer with kernel_heads -> the full model's attention time
    attention_scale = res.model.attention_layers * res.model.num_kv_heads / res.kernel_heads
    return Replica(sched, runner, clock, measured=cfg.clock == "measured", attention_scale=attention_scale,
                   timers=timers, sink=sink)


def replica_extra(res: Resolved, replica: Replica, backend: str) -> dict[str, Any]:
    """The summary keys of one replica that its tables cannot give: its strategy's counters and kernel figures."""
    strategy, runner = replica.scheduler.strategy, replica.runner
    return {
        **summary_counters(strategy.counters(), res.kv_bytes_per_token * strategy.block_size),
        "kernel_backend": backend,
        "kernel_time_s": runner.kernel_time_s if runner else 0.0,
        "kernel_gbps": (runner.kernel_bytes / runner.kernel_time_s / 1e9
                        if runner and runner.kernel_time_s > 0 else 0.0),
        "verify_max_rel_err": runner.verify_max_rel_err if runner else 0.0,
        **replica.scheduler.spec_counters(),
    }


def make_scheduler(cfg: RunConfig, res: Resolved, strategy: Strategy, requests: Sequence[Request], tokens: TokenStore,
                   *, kernel_every: int | None) -> Scheduler:
    config = SchedulerConfig(
        max_model_len=res.model.max_model_len, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=res.max_num_batched_tokens, watermark_frac=cfg.watermark_frac,
        swap=cfg.preemption == "swap", seed=cfg.seed, kernel_every=kernel_every, chunked_prefill=cfg.chunked_prefill,
        admission=cfg.admission, batching=cfg.batching, schedule=cfg.schedule,
        in_batch_prefix_tokens=cfg.in_batch_prefix_tokens, beam_branch_frac=cfg.beam_branch_frac,
        attention_windows=res.model.window_layer_fracs(), spec_tokens=cfg.spec_tokens, spec_accept=cfg.spec_accept,
        spec_draft_model=DRAFT_KV_LAYERS[cfg.spec_method] > 0)
    return Scheduler(strategy, requests, tokens, config)


def check_accepted(cfg: RunConfig, requests: Sequence[Request]) -> None:
    """Raise ConfigError when the trace's `accepted` column (speculative decoding) gives a request more accepted
    drafts a step than the drafts it writes (`spec_tokens`)."""
    if not cfg.spec_tokens:  # without speculation the column says nothing
        return
    if isinstance(requests, RequestColumns):  # a columns workload keeps the trace's column (None: none)
        accepted = requests.accepted
    else:
        accepted = np.array([r.accepted for r in requests], dtype=np.int64)
    if accepted is None or int(accepted.max(initial=-1)) <= cfg.spec_tokens:
        return
    i = int(np.argmax(accepted > cfg.spec_tokens))
    raise ConfigError(f"workload {cfg.workload}: request {i} has accepted = {int(accepted[i])} drafts a step, more "
                      f"than the spec_tokens = {cfg.spec_tokens} drafts it writes")


def check_servable(cfg: RunConfig, res: Resolved, requests: list[Request]) -> None:
    """Raise UnservableError when the workload's shortest request (fewest prompt + output tokens) is
    rejected even alone in an empty pool: then no request of the run can be served, and the run would
    measure nothing but rejections and write NaN figures. The request is replayed on a fresh strategy by
    the scheduler itself, so a refusal has the same reason a run would record (max_model_len, the
    pool, a strategy's own limits), whatever the workload's source."""
    shortest = shortest_request(requests)
    alone = [dataclasses.replace(shortest, request_id=0, arrival_s=0.0)]
    sched = make_scheduler(cfg, res, registry.create_from_config(cfg, res), alone, TokenStore(), kernel_every=None)
    now_s = 0.0
    sched.arrive(now_s)
    while sched.has_work() and not sched.log.num_rejected:
        plan = sched.schedule(now_s)
        if not plan.cost.num_running and not plan.started and not sched.log.num_rejected:
            reason = "never admitted"  # _simulate would report the run stuck
            break
        now_s += 1.0  # the clock plays no part in admission
        sched.complete(plan, now_s)
    else:
        if not sched.log.num_rejected:
            return
        reason = sched.log.status_of(0).removeprefix("rejected: ")
    seqs = f" × {shortest.n} samples" if shortest.n > 1 else (
        f" × {shortest.beam_width} beams" if shortest.beam_width > 1 else "")
    raise UnservableError(f"no request of the workload can be served with this configuration: the shortest, "
                          f"request {shortest.request_id} ({shortest.prompt_tokens} prompt + {shortest.output_tokens} "
                          f"output tokens{seqs}), is refused alone in an empty KV pool: {reason}")


def _drive(replica: Replica, progress: bool, sink: TableSink) -> None:
    """Step the replica until no request is left (a tqdm bar of finished requests with `progress`), handing
    the rows of done requests to `sink` in chunks, in request order."""
    from tqdm import tqdm

    sched = replica.scheduler
    log, requests = sched.log, sched.arrivals.requests
    rows_per_chunk = table_sink.ROWS_PER_CHUNK
    with tqdm(total=len(requests), unit="req", desc="requests", disable=not progress) as bar:
        while (at_s := replica.next_event_s()) is not None:
            finished = replica.step(at_s)
            if finished:
                bar.update(finished)
            if log.ready - log.base >= rows_per_chunk:
                sink.append(REQUESTS_TABLE, log.take_done(requests))
    if (rest := log.last_rows(requests)) is not None:
        sink.append(REQUESTS_TABLE, rest)


def _model_description(model) -> dict[str, Any]:
    """The model preset as plain data; an attention group names no mixer (only a recurrent one has it)."""
    described = asdict(model)
    described["layer_groups"] = [{k: v for k, v in g.items() if k != "mixer" or v is not None}
                                 for g in described["layer_groups"]]
    return described


def run_description(cfg: RunConfig, res: Resolved, backend: str) -> dict[str, Any]:
    """config.json: the resolved configuration and where it ran."""
    return {
        "config": cfg.to_dict(),
        "resolved": {"model": _model_description(res.model), "gpu": res.gpu.__dict__, "kv_slots": res.capacity_slots,
                     "swap_slots": res.swap_slots, "max_num_batched_tokens": res.max_num_batched_tokens,
                     "kv_bytes_per_token": res.kv_bytes_per_token, "kernel_heads": res.kernel_heads,
                     "layer_groups": res.layer_groups,
                     **({} if res.state is None else {"state": res.state._asdict(),
                                                      "state_bytes_per_seq": res.model.state_bytes_per_seq()})},
        "seed": cfg.seed, **code_version(), "kernel_backend": backend,
        "hardware": {"machine": platform.machine(), "processor": platform.processor(),
                     "python": platform.python_version(), "system": platform.system()},
    }
