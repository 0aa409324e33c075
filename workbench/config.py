"""The resolved configuration of one run: a frozen dataclass validated on construction.

Field metadata carries the CLI help (with units); `workbench.run` builds its argument parser from
these fields and sweep YAML keys are exactly these field names (DESIGN §8, §9).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _f(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class RunConfig:
    strategy: str = _f("paged", "allocator strategy name (see workbench.allocators.registry)")
    block_size: int = _f(16, "tokens per KV block for paged strategies")
    fit: str = _f("first", "placement for contiguous strategies: first | best | buddy",
                  choices=("first", "best", "buddy"))
    model: str = _f("opt-13b", "model preset name, or custom:layers=..,kv_heads=..,head_dim=..,...")
    kv_dtype: str = _f("fp16", "KV cache dtype", choices=("fp32", "fp16", "bf16", "fp8"))
    gpu: str = _f("a100-40gb", "GPU preset (capacity when --kv-gib is absent; roofline clock)")
    kv_gib: float | None = _f(None, "KV cache size in GiB (2^30 bytes); default: derived from the GPU")
    kv_slots: int | None = _f(None, "KV cache size in token slots (overrides --kv-gib)")
    max_model_len: int | None = _f(None, "maximum sequence length in tokens (default: the model preset's)")
    workload: str = _f("sharegpt-like", "synthetic workload name, or FORMAT:PATH for a trace file")
    rate: float | None = _f(None, "request rate in requests/s (synthetic arrivals; rescales a trace)")
    num_requests: int | None = _f(None, "cap on the number of requests")
    duration: float | None = _f(None, "time window of the workload in seconds from its start")
    seed: int = _f(0, "random seed; same config and seed give identical results")
    clock: str = _f("roofline", "step-duration model: roofline | measured", choices=("roofline", "measured"))
    kernel: str = _f("auto", "attention kernel backend: auto | cupy | numba | none",
                     choices=("auto", "cupy", "numba", "none"))
    kernel_every: int = _f(1, "run the attention kernel every k steps")
    kernel_heads: int | None = _f(None, "KV heads of the kernel's layer (default: the model's)")
    verify_every: int = _f(0, "verify sampled sequences against the reference every k steps (0 = never)")
    preemption: str = _f("recompute", "preemption mode: recompute | swap", choices=("recompute", "swap"))
    swap_gib: float = _f(4.0, "host swap space in GiB")
    max_num_seqs: int = _f(256, "maximum running sequences per step")
    max_num_batched_tokens: int | None = _f(None, "maximum tokens per step (default: max(max_model_len, 2048))")
    n: int = _f(1, "parallel samples per request")
    beam_width: int = _f(1, "beam search width (1 = off)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ValueError(f"{f.name}: {value!r} is not one of {', '.join(choices)}")
        positive = ("block_size", "kv_gib", "kv_slots", "max_model_len", "rate", "num_requests", "duration",
                    "kernel_every", "kernel_heads", "max_num_seqs", "max_num_batched_tokens", "n",
                    "beam_width")
        for name in positive:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.verify_every < 0:
            raise ValueError(f"verify_every must be >= 0, got {self.verify_every}")
        if self.swap_gib < 0:
            raise ValueError(f"swap_gib must be >= 0, got {self.swap_gib}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("n > 1 and beam_width > 1 are contradictory: choose parallel sampling or beam search")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown config key(s): {', '.join(unknown)}")
        return cls(**values)
