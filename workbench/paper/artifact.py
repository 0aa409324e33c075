"""The vLLM artifact's own accounting, computed from a run's step and request tables.

The paper's figures were drawn by the artifact's scripts (sosp-ae-39/sosp-ae-astra), whose definitions
differ from the workbench's (docs/memory.md) in two places the table compares:

- Fig. 2: the artifact counts as internal fragmentation only what a request reserved past its final
  length; the buddy allocator's round-up of that reservation to a power of two falls under "external
  fragmentation & others". The workbench counts the round-up as internal (the slots are allocated to
  the request and never written). `fig2_split` re-buckets a contiguous run's saturated steps that way.
- Fig. 15: the artifact's plot script averages, over steps, the ratio of logical to physical blocks
  and reports 1 - 1 / that mean; the workbench weighs blocks by step duration and reports 1 - physical /
  logical (`block_sharing_saving_frac`). `fig15_saving` is the artifact's estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.allocators import registry
from workbench.config import RunConfig


@dataclass(frozen=True)
class Fig2Split:
    internal_frac: float  # the artifact's internal fragmentation, share of the pool (saturated steps)
    external_frac: float  # the artifact's "external fragmentation & others": the rest of the waste


def running_counts(step_end_s: np.ndarray, admitted_s: np.ndarray, finish_s: np.ndarray,
                   weights: np.ndarray) -> np.ndarray:
    """Per step, the sum of `weights` over the requests in that step's snapshot.

    A step's snapshot is taken at its end (`t_s`): it holds every request admitted before that time
    that finished at it or later. Event counting, O((steps + requests) log steps)."""
    first = np.searchsorted(step_end_s, admitted_s, side="right")  # first step ending after admission
    last = np.searchsorted(step_end_s, finish_s, side="right")  # one past the last step ending by the finish
    delta = np.zeros(step_end_s.shape[0] + 1, dtype=np.float64)
    np.add.at(delta, first, weights)
    np.add.at(delta, last, -weights)
    return np.cumsum(delta[:-1])


def fig2_split(cfg: RunConfig, steps: pd.DataFrame, requests: pd.DataFrame) -> Fig2Split:
    """The artifact's internal / external shares of a contiguous strategy's run (saturated steps).

    Raises ValueError when the run is not a contiguous one that could be re-bucketed exactly: every
    request finished, never preempted, and the reconstructed snapshots hold `num_running` requests
    at every step (the check that the reconstruction is the engine's)."""
    strategy = registry.create_from_config(cfg, cfg.resolve())
    if not hasattr(strategy, "reservation_slots"):
        raise ValueError(f"{cfg.strategy}: not a contiguous strategy; its accounting is the artifact's already")
    if (requests["status"] != "finished").any() or (requests["num_preemptions"] > 0).any():
        raise ValueError(f"{cfg.strategy}: re-bucketing needs every request finished and never preempted")
    prompt = requests["prompt_tokens"].to_numpy()
    # the KV of a request's last sampled token is never written (docs/memory.md): final = prompt + output - 1
    final = prompt + requests["output_tokens"].to_numpy() - 1
    reserved_past_final = np.array([strategy.reservation_slots(int(f), int(p)) - int(f)
                                    for f, p in zip(final, prompt, strict=True)], dtype=np.float64)
    end_s = steps["t_s"].to_numpy()
    admitted, finished = requests["admitted_s"].to_numpy(), requests["finish_s"].to_numpy()
    counts = running_counts(end_s, admitted, finished, np.ones(len(requests)))
    if not np.array_equal(counts, steps["num_running"].to_numpy()):
        raise ValueError(f"{cfg.strategy}: the requests table does not reproduce the steps' batches")
    internal = running_counts(end_s, admitted, finished, reserved_past_final)
    saturated = steps["num_waiting"].to_numpy() > 0
    dt = steps["dt_s"].to_numpy()[saturated]
    capacity = float(steps[["token_slots", "reserved_slots", "internal_frag_slots", "cached_slots",
                            "external_frag_slots", "free_slots"]].iloc[0].sum())
    waste = capacity - (steps["token_slots"] + steps["reserved_slots"]).to_numpy()[saturated]
    ours_internal = steps["internal_frag_slots"].to_numpy()[saturated]
    artifact_internal = internal[saturated]
    if (artifact_internal > ours_internal).any():
        raise ValueError(f"{cfg.strategy}: a reservation past the final length exceeds the allocated slack")
    total_s = float(dt.sum())
    return Fig2Split(internal_frac=float(artifact_internal @ dt) / (capacity * total_s),
                     external_frac=float((waste - artifact_internal) @ dt) / (capacity * total_s))


def fig15_saving(steps: pd.DataFrame) -> float:
    """1 - 1 / mean over steps of logical / physical blocks (the artifact's plot/plot_fig15.py), over
    the steps that hold blocks."""
    physical = (steps["token_slots"] + steps["reserved_slots"] + steps["internal_frag_slots"]).to_numpy()
    logical = steps["unshared_block_slots"].to_numpy()
    holding = physical > 0
    return 1.0 - 1.0 / float(np.mean(logical[holding] / physical[holding]))
