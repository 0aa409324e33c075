"""`build_workload(cfg)`: the requests of one run, from a synthetic name or a trace (docs/workloads.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench.config import RunConfig
from workbench.errors import TraceError, WorkloadError
from workbench.presets import model_from_name
from workbench.traces import TRACES, resolve
from workbench.workload import synthetic
from workbench.workload.mooncake import read_mooncake
from workbench.workload.readers import read_azure, read_burstgpt, read_lengths
from workbench.workload.request import Request
from workbench.workload.spec import WorkloadSpec, parse_spec
from workbench.workload.table import RequestTable, finalize


@dataclass(frozen=True)
class Workload:
    spec: str
    requests: Sequence[Request]  # a RequestColumns: each Request is built when it is read
    source: str  # "synthetic" or the trace file read
    notes: list[str] = field(default_factory=list)  # rows a reader dropped or changed, and why


def build_workload(cfg: RunConfig) -> Sequence[Request]:
    """Requests sorted by arrival, ids 0..N-1, the first arriving at t = 0; same cfg, same requests (columns
    read as a sequence of `Request`s: workbench.workload.request.RequestColumns).
    Never empty: the first arrival is at t = 0 and RunConfig keeps duration and the cap positive."""
    return load_workload(cfg).requests


def load_workload(cfg: RunConfig) -> Workload:
    """`build_workload` plus what the reader did on the way (for `describe`). Raises WorkloadError."""
    spec = parse_spec(cfg.workload)
    num_requests = cfg.num_requests
    if spec.path is None and num_requests is None and cfg.duration is None:
        num_requests = synthetic.DEFAULT_NUM_REQUESTS
    max_model_len = cfg.max_model_len or model_from_name(cfg.model).max_model_len
    if spec.path is None:
        table = synthetic.generate(spec, seed=cfg.seed, rate=cfg.rate, num_requests=num_requests,
                                   duration_s=cfg.duration, max_model_len=max_model_len)
        source, rescale = "synthetic", None
    else:
        path = trace_path(spec)
        table = _read_trace(spec, path, seed=cfg.seed, rate=cfg.rate, max_model_len=max_model_len)
        source = str(path)
        rescale = None if spec.kind == "lengths" else cfg.rate  # lengths arrivals are already at the rate
    try:
        requests = finalize(table, seed=cfg.seed, rate=rescale, duration_s=cfg.duration,
                            num_requests=num_requests, n=cfg.n, beam_width=cfg.beam_width)
    except ValueError as exc:
        raise WorkloadError(cfg.workload, None, "rate", "arrivals spread over time to rescale", str(exc)) from None
    return Workload(cfg.workload, requests, source, table.notes)


def check_workload(cfg: RunConfig) -> None:
    """What can be said against the workload before a run, cheaply: a synthetic workload's parameters and
    lengths against max_model_len (by generating one request), a trace's file or registry name (without
    reading or fetching it). Raises WorkloadError."""
    spec = parse_spec(cfg.workload)
    max_model_len = cfg.max_model_len or model_from_name(cfg.model).max_model_len
    if spec.path is None:
        synthetic.generate(spec, seed=cfg.seed, rate=cfg.rate, num_requests=1, duration_s=None,
                           max_model_len=max_model_len)
    elif not Path(spec.path).expanduser().is_file() and spec.path not in TRACES:
        raise WorkloadError(spec.text, None, "path", f"an existing file or a registry trace name "
                            f"({', '.join(sorted(TRACES))})", spec.path)


def trace_path(spec: WorkloadSpec) -> Path:
    """The file a trace spec names: an existing path, else a registry trace (cache, shared folder, fetch)."""
    path = Path(spec.path).expanduser()
    if path.is_file():
        return path
    if spec.path in TRACES:
        try:
            return resolve(spec.path)
        except TraceError as exc:
            # the trace error already says what to do; it is passed on whole, never shortened
            raise WorkloadError(spec.text, None, "path", f"a readable trace ({exc})") from None
    raise WorkloadError(spec.text, None, "path", f"an existing file or a registry trace name "
                        f"({', '.join(sorted(TRACES))})", spec.path)


def _read_trace(spec: WorkloadSpec, path: Path, *, seed: int, rate: float | None, max_model_len: int) -> RequestTable:
    if spec.kind == "azure":
        return read_azure(path, spec)
    if spec.kind == "burstgpt":
        return read_burstgpt(path, spec)
    if spec.kind == "mooncake":
        return read_mooncake(path, spec)
    return read_lengths(path, spec, seed=seed, rate=synthetic.DEFAULT_RATE if rate is None else rate,
                        max_model_len=max_model_len)
