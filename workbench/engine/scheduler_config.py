"""The scheduling limits and policies of one replica (workbench.engine.scheduler, docs/engine.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduling limits and policies of one replica (docs/engine.md)."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    watermark_frac: float = 0.0  # free blocks (share of the pool) admission keeps for running groups
    swap: bool = False  # preempt by swapping when the strategy and the host pool allow, else recompute
    seed: int = 0
    # None when no kernel consumes the plans (they then carry no kernel inputs); else attention runs at
    # steps divisible by it, and those plans carry the kernels' descriptors
    kernel_every: int | None = None
    chunked_prefill: bool = False
    admission: str = "fcfs"  # or "skip": pass over waiting groups the pool cannot place
    batching: str = "continuous"  # or "static": admit only into an empty batch (workbench.engine.rules.admits_now)
    schedule: str = "fcfs"  # the order waiting groups are tried in (workbench.engine.admission_order)
    in_batch_prefix_tokens: int = 32  # lpm's in-batch prefix check (admission_order; 0: off)
    beam_branch_frac: float = 1.0
    spec_tokens: int = 0  # speculative decoding's draft tokens per step (workbench.engine.speculation; 0: off)
    spec_accept: float = 0.7  # the per-token acceptance probability
    spec_draft_model: bool = True  # a draft model runs (EAGLE, MTP) and the clock charges it; False: n-gram
    attention_windows: tuple[tuple[int, float], ...] = ()  # (window, layer fraction): step_cost
