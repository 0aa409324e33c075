"""The resolved configuration of one run: a frozen dataclass validated on construction.

Field metadata carries the CLI help (with units); `workbench.run` builds its argument parser from
these fields and sweep YAML keys are exactly these field names (DESIGN §8, §9).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from workbench.presets import GIB, GpuPreset, ModelPreset, gpu_from_name, kv_capacity_slots, model_from_name


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
    gpu_memory_utilization: float = _f(0.9, "fraction of GPU memory the server may use when deriving KV capacity")
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
    verify_every: int = _f(0, "every k steps, check up to 8 decoding and 2 prefilling sequences of the batch "
                              "against the float64 reference (0 = never)")
    preemption: str = _f("recompute", "preemption mode: recompute | swap", choices=("recompute", "swap"))
    swap_gib: float = _f(4.0, "host swap space in GiB")
    max_num_seqs: int = _f(256, "maximum running sequences per step")
    max_num_batched_tokens: int | None = _f(None, "token budget of a step: prefill tokens, or with --chunked-prefill "
                                                  "decode plus prefill-chunk tokens "
                                                  "(default: max(max_model_len, 2048))")
    chunked_prefill: bool = _f(False, "split prompts into chunks that fill each step's token budget after its decodes "
                                      "(Sarathi-Serve, vLLM v1)")
    watermark_frac: float = _f(0.01, "fraction of KV blocks kept free at admission (paged strategies)")
    n: int = _f(1, "parallel samples per request")
    beam_width: int = _f(1, "beam search width (1 = off)")
    # Roofline defaults: sustained HBM streaming reaches ~80% of the datasheet bandwidth on A100/H100
    # (STREAM-like copies), large fp16 GEMMs ~50-60% of dense peak in serving (prefill MFU), and a
    # serving engine spends ~1 ms per iteration on scheduling, sampling and launches outside the GPU.
    eff_bw: float = _f(0.8, "achieved fraction of HBM bandwidth (roofline clock)")
    eff_flops: float = _f(0.5, "achieved fraction of dense peak FLOP/s (roofline clock)")
    step_overhead_s: float = _f(1e-3, "fixed per-step overhead in seconds (roofline clock)")

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
        for name in ("gpu_memory_utilization", "eff_bw", "eff_flops"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0 <= self.watermark_frac < 1:
            raise ValueError(f"watermark_frac must be in [0, 1), got {self.watermark_frac}")
        if self.step_overhead_s < 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s}")
        if self.verify_every < 0:
            raise ValueError(f"verify_every must be >= 0, got {self.verify_every}")
        if self.swap_gib < 0:
            raise ValueError(f"swap_gib must be >= 0, got {self.swap_gib}")
        if self.kernel == "none" and self.verify_every:
            raise ValueError("verify_every > 0 needs a kernel to verify: contradictory with kernel none")
        if self.kernel == "none" and self.clock == "measured":
            raise ValueError("clock measured times the kernel: contradictory with kernel none")
        if max(self.n, self.beam_width) > self.max_num_seqs:
            raise ValueError(f"a request of {max(self.n, self.beam_width)} sequences can never run with "
                             f"max_num_seqs = {self.max_num_seqs}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("n > 1 and beam_width > 1 are contradictory: choose parallel sampling or beam search")

    def resolve(self) -> Resolved:
        """The derived sizes of this run; raises ValueError naming the flag for impossible combinations."""
        model = model_from_name(self.model)
        max_model_len = self.max_model_len or model.max_model_len
        model = dataclasses.replace(model, max_model_len=max_model_len)
        gpu = gpu_from_name(self.gpu)
        if self.kv_slots is not None:
            capacity_slots = self.kv_slots
        else:
            capacity_slots = kv_capacity_slots(model, self.kv_dtype, kv_gib=self.kv_gib, gpu=gpu,
                                               gpu_memory_utilization=self.gpu_memory_utilization)
        if capacity_slots < max_model_len:
            raise ValueError(f"the KV pool ({capacity_slots} slots) cannot hold a single request of "
                             f"max_model_len = {max_model_len} tokens; raise --kv-gib/--kv-slots or lower "
                             f"--max-model-len")
        max_batched = self.max_num_batched_tokens or max(max_model_len, 2048)
        if self.chunked_prefill and max_batched < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_batched}) < max_num_seqs ({self.max_num_seqs}): with "
                             f"chunked prefill a step's decodes alone could exceed the token budget")
        if not self.chunked_prefill and max_batched < max_model_len:
            raise ValueError(f"max_num_batched_tokens ({max_batched}) < max_model_len ({max_model_len}): "
                             f"a long prompt could never be prefilled (without --chunked-prefill)")
        if self.kernel_heads is not None and self.kernel_heads > model.num_kv_heads:
            raise ValueError(f"kernel_heads ({self.kernel_heads}) exceeds the model's {model.num_kv_heads} kv heads")
        kv_bytes_per_token = model.kv_bytes_per_token(self.kv_dtype)
        if self.kernel != "none" and self.kv_dtype == "fp8":
            raise ValueError("kv_dtype fp8 has no attention kernel; use --kernel none for fp8 accounting")
        return Resolved(
            model=model, gpu=gpu, capacity_slots=capacity_slots,
            swap_slots=int(self.swap_gib * GIB // kv_bytes_per_token) if self.preemption == "swap" else 0,
            max_num_batched_tokens=max_batched, kv_bytes_per_token=kv_bytes_per_token,
            kernel_heads=self.kernel_heads or model.num_kv_heads,
        )

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


@dataclass(frozen=True)
class Resolved:
    """Sizes derived from a RunConfig and the presets; memory accounting always uses the full model."""

    model: ModelPreset  # with max_model_len applied
    gpu: GpuPreset
    capacity_slots: int
    swap_slots: int  # host swap pool in token slots (0 unless preemption = swap)
    max_num_batched_tokens: int
    kv_bytes_per_token: int
    kernel_heads: int  # kv heads of the kernel's single layer
