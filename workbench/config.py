"""The resolved configuration of one run: a frozen dataclass validated on construction.

Field metadata carries the CLI help (with units); `workbench.run` builds its argument parser from
these fields and sweep YAML keys are exactly these field names (docs/outputs.md).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.allocators.state.policies import POLICIES as STATE_POLICIES
from workbench.clock.profiles import PROFILE_NAMES, check_profile
from workbench.errors import shown
from workbench.presets import (
    DEFAULT_KV_LINK_GB_S,
    DEFAULT_SHARED_LINK_GB_S,
    GIB,
    GpuPreset,
    ModelPreset,
    gpu_from_name,
    kv_capacity_slots,
    model_from_name,
)
from workbench.state_pool import StateSizes, state_sizes, unified_block_size

# Upper bounds that keep every size inside the integer types it lands in: slot and block ids are int32
# in the allocators and kernels, and every integer column of the output tables is int64. The time
# bounds (rate, duration, efficiencies, step overhead) keep slot-seconds far from float64 overflow.
MAX_SLOTS = 2**31 - 1
MAX_INT = 2**63 - 1
MAX_REQUESTS = 10_000_000  # a synthetic workload is generated in memory up front, ~1 KB per request
MIN_MODEL_LEN = 2  # one prompt token and one output token
MAX_REPLICAS = 1024
# Ranges a real system can have, so that no flag's value is absorbed by float64 arithmetic (a link of 1e-300
# GB/s "runs" with steps too short to move the clock): memory sizes up to 64 TiB (a 64-GPU node's HBM,
# or a host's DRAM, many times over), a KV pool of at least 1 KiB, links from 0.01 GB/s (80 Mb/s) to
# 10 TB/s (several NVLink 5 ports), efficiencies from 1% of the hardware's peak.
MAX_GIB = 2**16
MIN_KV_GIB = 1e-6
MIN_LINK_GB_S, MAX_LINK_GB_S = 0.01, 10_000.0
MIN_EFF = 0.01
# how a fleet's router picks a replica for each arrival (workbench.fleet.routers, docs/fleet.md)
ROUTER_NAMES = ("round-robin", "least-loaded", "power-of-two", "session", "cache-aware", "kv-exact")
# speculative decoding (workbench.engine.speculation): at most this many draft tokens per step, and the drafts;
# KV layers a draft keeps per token: EAGLE's head and DeepSeek's MTP module are one decoder layer of the
# target's geometry whose KV shares the target's blocks (vLLM allocates it in the same KV-cache group), an
# n-gram draft looks tokens up in the prompt and keeps none
MAX_SPEC_TOKENS = 16
DRAFT_KV_LAYERS = {"eagle": 1, "mtp": 1, "ngram": 0}
SPEC_METHODS = tuple(DRAFT_KV_LAYERS)
# the order a replica admits its waiting requests in: SGLang's --schedule-policy names (engine.admission_order)
SCHEDULE_NAMES = ("fcfs", "lpm", "dfs-weight", "lof", "random")


def _f(default: Any, help: str, **extra: Any) -> Any:
    """A config field: `help` (with units) becomes the CLI help; optional `choices`, and bounds `gt`/`ge`
    (lower) and `lt`/`le` (upper) checked on construction."""
    return field(default=default, metadata={"help": help, **extra})


_BOUNDS = {"gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt), "le": ("<=", operator.le)}


def describe_bounds(f: dataclasses.Field) -> str:
    """The field's allowed range for help texts, e.g. `> 0, <= 2147483647` ('' when unbounded)."""
    return ", ".join(f"{sign} {f.metadata[key]}" for key, (sign, _) in _BOUNDS.items() if key in f.metadata)


def plain_value(f: dataclasses.Field, value: Any) -> Any:
    """`value` as the plain Python type of the field (int, float, str, bool), which is what config.json,
    the point ids and the engine's arithmetic expect: a NumPy or pandas scalar (`numpy.int64(2)`,
    `numpy.float32(0.5)`, `numpy.bool_(True)`), a `fractions.Fraction` or a `decimal.Decimal` is what a
    notebook passes. Raises ValueError (one line) for a value of no such kind; `check_field` then checks it."""
    name, kind = f.name, str(f.type).replace(" | None", "")
    if value is None:
        if "None" not in str(f.type):
            raise ValueError(f"{name} must be given, got None")
        return None
    expected = {"bool": "true or false", "str": "a string", "int": "an integer", "float": "a number"}[kind]
    if kind == "bool":
        if isinstance(value, bool | np.bool_):  # numpy.bool_ is no subclass of bool
            return bool(value)
    elif kind == "str":
        if isinstance(value, str):
            return str(value)
    elif isinstance(value, bool | np.bool_):
        pass  # true/false is never a number here, as in YAML and on the command line
    elif kind == "int" and isinstance(value, numbers.Integral):
        return operator.index(value)
    elif kind == "float" and isinstance(value, numbers.Real | decimal.Decimal):
        try:
            return float(value)
        except OverflowError:  # a Fraction or an integer beyond float64
            raise ValueError(f"{name} must be a finite number, got {shown(value)}") from None
    raise ValueError(f"{name} must be {expected}, got {type(value).__name__} {shown(value)}")


def check_field(f: dataclasses.Field, value: Any) -> None:
    """Raise ValueError (one line naming the key, the value and what is allowed) when `value` breaks
    the field's type, choices or bounds. Floats must be finite; integers stay within int64."""
    name, meta, kind = f.name, f.metadata, str(f.type).replace(" | None", "")
    if value is None:
        if "None" not in str(f.type):
            raise ValueError(f"{name} must be given, got None")
        return
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {shown(value)}")
        return
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {shown(value)}")
        if meta.get("choices") and value not in meta["choices"]:
            raise ValueError(f"{name}: {shown(value)} is not one of {', '.join(meta['choices'])}")
        return
    number = numbers.Real if kind == "float" else numbers.Integral
    if isinstance(value, bool) or not isinstance(value, number):
        expected = "a number" if kind == "float" else "an integer"
        raise ValueError(f"{name} must be {expected}, got {type(value).__name__} {shown(value)}")
    if kind == "float" and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    for key, (sign, holds) in _BOUNDS.items():
        if key in meta and not holds(value, meta[key]):
            raise ValueError(f"{name} must be {sign} {meta[key]}, got {shown(value)}")
    if kind == "int" and value > MAX_INT:
        raise ValueError(f"{name} must be <= {MAX_INT}, got {shown(value)}")


@dataclass(frozen=True)
class RunConfig:
    strategy: str = _f("paged", "allocator strategy name (see workbench.allocators.registry)")
    block_size: int = _f(16, "tokens per KV block for paged strategies", gt=0, le=MAX_SLOTS)
    fit: str = _f("first", "placement for contiguous strategies: first | best | buddy",
                  choices=("first", "best", "buddy"))
    eviction: str = _f("lru", "eviction order of a prefix cache: lru | fifo | lfu | depth (deepest first)",
                       choices=("lru", "fifo", "lfu", "depth"))
    # `walk`: the values the generic random walks of the allocators try (tests/allocators)
    host_cache_gib: float = _f(0.0, "host tier of a prefix cache in GiB (2^30 bytes): evicted prefix blocks are "
                                    "demoted to host memory and promoted back on a hit (0 = none)", ge=0, le=MAX_GIB,
                               walk=(0.0, 0.3))
    overlap_load: bool = _f(False, "host-tier loads of a prefix cache overlap the step's compute (else they add to it)")
    # a fleet's shared tier (docs/fleet.md): one pool below every replica's own tiers
    shared_tier_gib: float = _f(0.0, "KV block pool of a prefix cache shared by every replica, in GiB (2^30 bytes): "
                                     "blocks evicted from a replica's device (or dropped by its host tier) are "
                                     "demoted into it and copied back on a hit by any replica (0 = none)",
                                ge=0, le=MAX_GIB)
    shared_link_gb_s: float = _f(DEFAULT_SHARED_LINK_GB_S, "GB/s (10^9 bytes/s) of the link a shared-tier load "
                                 "crosses, one direction (default 25: one 200 Gb/s RDMA NIC port)", ge=MIN_LINK_GB_S,
                                 le=MAX_LINK_GB_S)
    hybrid: str = _f("on", "per-layer-group allocation for models with sliding-window layers (paged strategies "
                          "without a prefix cache): on | off (off: every layer is full attention)",
                     choices=("on", "off"))
    pow2_round: str = _f("final", "what contiguous-pow2 rounds up to a power of two: final (prompt + output) | "
                                  "output (the prompt stays exact: the vLLM paper's Orca Pow2)",
                         choices=("final", "output"))
    # virtual-contiguous (vAttention, arXiv 2405.04437): pages per layer K/V buffer, virtual extents, mapping cost
    page_kib: int = _f(2048, "virtual-contiguous: physical page size in KiB per layer K or V buffer, a multiple of "
                             "the GPU's 4 KiB page (2048 = CUDA's granularity; 64 = vAttention's driver extension)",
                       gt=0, le=2**20)
    max_batch: int = _f(256, "virtual-contiguous: virtual extents of max_model_len tokens reserved up front "
                             "(the most requests on the device at once)", gt=0, le=MAX_SLOTS)
    page_reuse: str = _f("off", "virtual-contiguous: keep a finished request's pages mapped for the next request "
                                "in its extent (reclaimed when free pages run out): on | off", choices=("off", "on"))
    map_us_per_page: float | None = _f(None, "virtual-contiguous: microseconds to map one physical page into one "
                                       "layer's K or V buffer (default: cuMemMap 2 + cuMemSetAccess 38 = 40, "
                                       "vAttention's Table 3 at 2 MiB, arXiv 2405.04437v3; sizes it does not "
                                       "measure take the nearest measured size's, see docs/strategies.md)",
                                       ge=0, le=1e6)
    overlap_map: str = _f("off", "virtual-contiguous: map pages on a background thread, overlapping the step's "
                                 "compute (vAttention's latency hiding): on | off", choices=("off", "on"))
    model: str = _f("opt-13b", "model preset name, or custom:layers=..,kv_heads=..,head_dim=..,...")
    kv_dtype: str = _f("fp16", "KV cache dtype", choices=("fp32", "fp16", "bf16", "fp8"))
    weight_dtype: str | None = _f(None, "bytes per weight for capacity and the clock's weight reads: fp16 | bf16 | "
                                        "fp8 (default: the model preset's; DeepSeek-V3 and Kimi-K2 ship fp8)",
                                  choices=("fp16", "bf16", "fp8"))
    gpu: str = _f("a100-40gb", "GPU preset (capacity when --kv-gib is absent; roofline clock)")
    tp: int = _f(1, "tensor-parallel GPUs per replica: each holds 1/tp of the weights and of every KV block's "
                    "heads (a latent KV: all of every block), one KV manager for all of them; the clock adds two "
                    "all-reduces per layer over the GPUs' link (docs/engine.md)", ge=1, le=64)
    gpu_memory_utilization: float = _f(0.9, "fraction of GPU memory the server may use when deriving KV capacity",
                                       ge=MIN_EFF, le=1)
    kv_gib: float | None = _f(None, "KV cache size in GiB (2^30 bytes); default: derived from the GPU", ge=MIN_KV_GIB,
                              le=MAX_GIB)
    kv_slots: int | None = _f(None, "KV cache size in token slots (overrides --kv-gib)", gt=0, le=MAX_SLOTS)
    max_model_len: int | None = _f(None, "maximum sequence length in tokens (default: the model preset's)",
                                   ge=MIN_MODEL_LEN, le=MAX_SLOTS)
    workload: str = _f("sharegpt-like", "synthetic workload name, or FORMAT:PATH for a trace file")
    rate: float | None = _f(None, "request rate in requests/s (synthetic arrivals; rescales a trace)", ge=1e-6,
                            le=1e9)
    num_requests: int | None = _f(None, "cap on the number of requests", gt=0, le=MAX_REQUESTS)
    duration: float | None = _f(None, "time window of the workload in seconds from its start", gt=0, le=1e9)
    seed: int = _f(0, "random seed; same config and seed give identical results", ge=0)
    clock: str = _f("roofline", "step-duration model: roofline | measured", choices=("roofline", "measured"))
    clock_profile: str = _f("roofline", "step-time constants: roofline (the --eff-* and --step-overhead-s flags) | "
                                        "vllm-sosp23-a100 (fitted to the vLLM paper; docs/clock-profiles.md)",
                            choices=PROFILE_NAMES)
    kernel: str = _f("auto", "attention kernel backend: auto | cupy | numba | none",
                     choices=("auto", "cupy", "numba", "none"))
    kernel_every: int = _f(1, "run the attention kernel every k steps", gt=0)
    kernel_heads: int | None = _f(None, "KV heads of the kernel's layer (default: the model's)", gt=0)
    verify_every: int = _f(0, "every k steps, check up to 8 decoding and 2 prefilling sequences of the batch "
                              "against the float64 reference (0 = never)", ge=0)
    preemption: str = _f("recompute", "preemption mode: recompute | swap", choices=("recompute", "swap"))
    swap_gib: float = _f(4.0, "host swap space in GiB", ge=0, le=MAX_GIB)
    max_num_seqs: int = _f(256, "maximum running sequences per step", gt=0, le=MAX_SLOTS)
    max_num_batched_tokens: int | None = _f(None, "token budget of a step: prefill tokens, or with --chunked-prefill "
                                                  "decode plus prefill-chunk tokens (default: max(max_model_len, "
                                                  "2048))", gt=0, le=MAX_SLOTS)
    chunked_prefill: bool = _f(False, "split prompts into chunks that fill each step's token budget after its decodes "
                                      "(Sarathi-Serve, vLLM v1)")
    watermark_frac: float = _f(0.01, "fraction of KV blocks kept free at admission (paged strategies)", ge=0, lt=1)
    admission: str = _f("fcfs", "admission when the oldest waiting request does not fit in the KV pool: fcfs (wait: "
                                "head-of-line blocking, as vLLM 0.1 and the paper's Orca) | skip (admit later "
                                "requests that fit)", choices=("fcfs", "skip"))
    batching: str = _f("continuous", "continuous (requests join and leave the batch at every step, as vLLM and Orca) | "
                                     "static (FasterTransformer-style: a batch of waiting requests is admitted and "
                                     "runs until its longest request ends before the next is admitted)",
                       choices=("continuous", "static"))
    schedule: str = _f("fcfs", "order a replica admits its waiting requests in (SGLang's --schedule-policy): fcfs "
                               "(arrival) | lpm (longest prefix cached first) | dfs-weight (depth-first over the radix "
                               "tree, subtrees with more waiting requests first) | lof (longest output first) | random "
                               "(a seeded shuffle each step); lpm and dfs-weight read the strategy's prefix index",
                       choices=SCHEDULE_NAMES)
    in_batch_prefix_tokens: int = _f(32, "--schedule lpm: a waiting request with at most this many tokens cached whose "
                                         "first this many tokens a request ahead of it shares is admitted after the "
                                         "others (SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD; 0 = off)",
                                     ge=0, le=MAX_SLOTS)
    spec_tokens: int = _f(0, "speculative decoding: draft tokens each decoding sequence writes and the target "
                             "verifies per step (vLLM's lookahead slots; 0 = off; docs/speculative.md)", ge=0,
                          le=MAX_SPEC_TOKENS)
    spec_method: str = _f("eagle", "speculative decoding's draft: eagle | mtp (one decoder layer of the target's "
                                   "geometry, its KV in every block) | ngram (prompt lookup: no model, no KV)",
                          choices=SPEC_METHODS)
    spec_accept: float = _f(0.7, "speculative decoding: probability that a draft token is accepted given the one "
                                 "before it was (a step accepts j or more drafts with probability alpha^j)",
                            gt=0, le=1)
    state_checkpoints: str = _f("none", "prefix caching of a recurrent model's state (docs/recurrent.md): none | "
                                        "align | all | tree | marconi (which block boundaries keep a copy of the "
                                        "state; a hit needs one where it ends); paged-prefix and radix",
                                choices=STATE_POLICIES)
    state_cache_gib: float | None = _f(None, "memory recurrent-state checkpoints may hold, GiB of the KV pool "
                                             "(default: the pool bounds them)", gt=0, le=MAX_GIB)
    unify_page_size: bool = _f(False, "a recurrent model's pages as vLLM's hybrid allocator sizes them: the "
                                      "attention block size raised until one block of an attention layer holds one "
                                      "recurrent layer's state (docs/recurrent.md)")
    n: int = _f(1, "parallel samples per request", gt=0, le=MAX_SLOTS)
    beam_width: int = _f(1, "beam search width (1 = off)", gt=0, le=MAX_SLOTS)
    beam_branch_frac: float = _f(1.0, "fraction of beam-search decode steps that re-rank the beams together (forks "
                                      "and prunes); at the others each beam extends itself (1 = every step)",
                                 ge=0, le=1)
    # Roofline defaults: sustained HBM streaming reaches ~80% of the datasheet bandwidth on A100/H100
    # (STREAM-like copies), transformer-shaped fp16 GEMMs of >= 4096 rows ~75% of dense peak (fewer
    # rows reach less: workbench.clock.roofline.gemm_shape_frac), and a serving engine spends ~1 ms per
    # iteration on scheduling, sampling and launches outside the GPU.
    eff_bw: float = _f(0.8, "achieved fraction of HBM bandwidth (roofline clock)", ge=MIN_EFF, le=1)
    eff_flops: float = _f(0.75, "achieved fraction of dense peak FLOP/s by GEMMs of >= 4096 tokens; "
                                "smaller steps reach less (roofline clock)", ge=MIN_EFF, le=1)
    step_overhead_s: float = _f(1e-3, "fixed per-step overhead in seconds (roofline clock)", ge=0, le=3600)
    replicas: int = _f(1, "copies of the engine behind one router, each with this whole configuration (its own "
                          "KV pool of --kv-gib); 1 = a single instance", gt=0, le=MAX_REPLICAS)
    router: str = _f("round-robin", "how the router picks a replica for each arriving request (--replicas > 1): "
                     + " | ".join(ROUTER_NAMES), choices=ROUTER_NAMES)
    kv_overlap_weight: float = _f(1.0, "kv-exact router: weight of a prompt block a replica would prefill against a "
                                  "block its running requests hold (Dynamo's --kv-overlap-score-weight)", ge=0, le=1e6)
    # disaggregated prefill/decode (docs/fleet.md): both 0 = colocated replicas
    prefill_replicas: int = _f(0, "disaggregated prefill/decode: replicas that only prefill prompts (the router "
                                  "picks among them), with --decode-replicas; 0 = colocated", ge=0, le=MAX_REPLICAS)
    decode_replicas: int = _f(0, "disaggregated prefill/decode: replicas that only decode, each request's KV "
                                 "shipped to them from its prefill replica; 0 = colocated", ge=0, le=MAX_REPLICAS)
    kv_link_gb_s: float = _f(DEFAULT_KV_LINK_GB_S, "GB/s (10^9 bytes/s) of every replica's NIC port, each direction, "
                             "that a prompt's KV crosses from its prefill to its decode replica (default 25: one "
                             "200 Gb/s RDMA NIC port)", ge=MIN_LINK_GB_S, le=MAX_LINK_GB_S)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = plain_value(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)  # frozen: the plain value replaces what was passed
            check_field(f, value)
        if self.page_kib % 4:
            raise ValueError(f"page_kib must be a multiple of the GPU's 4 KiB page, got {self.page_kib}")
        if self.kernel == "none" and self.verify_every:
            raise ValueError("verify_every > 0 needs a kernel to verify: contradictory with kernel none")
        check_profile(self)
        if self.kernel == "none" and self.clock == "measured":
            raise ValueError("clock measured times the kernel: contradictory with kernel none")
        if max(self.n, self.beam_width) > self.max_num_seqs:
            raise ValueError(f"a request of {max(self.n, self.beam_width)} sequences can never run with "
                             f"max_num_seqs = {self.max_num_seqs}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("n > 1 and beam_width > 1 are contradictory: choose parallel sampling or beam search")
        if self.unify_page_size:
            model = model_from_name(self.model)
            if not model.has_state:
                raise ValueError(f"unify_page_size sizes pages for recurrent layers: model {self.model} has none")
            object.__setattr__(self, "block_size", unified_block_size(model, self.block_size, self.kv_dtype))
        if self.batching == "static" and self.chunked_prefill:
            raise ValueError("batching static prefills each batch whole when it starts: contradictory with "
                             "chunked_prefill, which mixes prompt chunks into running batches")

    def _check_speculation(self) -> None:
        """What speculative decoding is built for (docs/speculative.md)."""
        if self.n > 1 or self.beam_width > 1:
            raise ValueError("spec_tokens > 0 drafts for one sequence per request: n > 1 and beam_width > 1 are not "
                             "built for it")

    def _check_disaggregated(self) -> None:
        """Disaggregated prefill/decode (docs/fleet.md): both pools or neither, and a consistent fleet size."""
        prefill, decode = self.prefill_replicas, self.decode_replicas
        if (prefill == 0) != (decode == 0):
            raise ValueError(f"prefill_replicas ({prefill}) and decode_replicas ({decode}) go together: both >= 1 "
                             f"(disaggregated) or both 0 (colocated)")
        if not prefill:
            return
        if self.replicas not in (1, prefill + decode):
            raise ValueError(f"replicas ({self.replicas}) contradicts prefill_replicas + decode_replicas "
                             f"({prefill} + {decode}): leave replicas at 1 or set it to {prefill + decode}")
        if self.n > 1 or self.beam_width > 1:
            raise ValueError("disaggregated prefill/decode ships one sequence's KV per request: n > 1 and "
                             "beam_width > 1 are not built for it")
        if self.shared_tier_gib:
            raise ValueError("shared_tier_gib with prefill_replicas/decode_replicas is not built: a shared tier "
                             "serves colocated replicas")
        if self.batching == "static":
            raise ValueError("batching static with prefill_replicas/decode_replicas is not built: a static batch "
                             "prefills and decodes on one engine (FasterTransformer)")

    @property
    def num_engines(self) -> int:
        """Engines the run builds: prefill + decode replicas when disaggregated, else `replicas`."""
        return self.prefill_replicas + self.decode_replicas if self.prefill_replicas else self.replicas

    def resolve(self) -> Resolved:
        """The derived sizes of this run; raises ValueError naming the flag for impossible combinations."""
        # here, not on construction: a sweep checks each axis value alone, and the pools go in pairs
        self._check_disaggregated()
        if self.spec_tokens:
            self._check_speculation()
        model = model_from_name(self.model)
        if self.weight_dtype is not None:
            model = dataclasses.replace(model, weight_dtype=self.weight_dtype)
        if self.kernel_heads is not None and model.kv_layout == "latent":
            raise ValueError(f"kernel_heads applies to per-head K/V: model {model.name} stores one latent row per "
                             f"token shared by all its heads (kv_layout latent); drop --kernel-heads")
        if model.num_kv_heads % self.tp and not model.kv_replicated:
            raise ValueError(f"tp ({self.tp}) must divide the model's {model.num_kv_heads} kv heads: each GPU holds "
                             f"whole heads of every block")
        max_model_len = self.max_model_len or model.max_model_len
        # a query never has more than max_model_len tokens to choose from: a top-k above a lowered length
        # attends to every token, exactly as top-k = max_model_len does
        model = dataclasses.replace(model, max_model_len=max_model_len, kv_dtype=self.kv_dtype,
                                    index_topk=min(model.index_topk, max_model_len))
        if self.spec_tokens and model.window_layer_fracs():
            raise ValueError(f"spec_tokens > 0 is built for full attention: model {model.name} has sliding-window "
                             f"or sparse (top-k) layers")
        if self.spec_tokens and model.kv_layout == "latent" and self.kernel != "none":
            raise ValueError(f"spec_tokens > 0 with a kernel needs per-head K/V: model {model.name} stores a latent "
                             f"row, whose kernel decodes one query per sequence; use kernel none")
        gpu = gpu_from_name(self.gpu)
        if self.kv_slots is not None:
            capacity_slots = self.kv_slots
        else:
            capacity_slots = kv_capacity_slots(model, self.kv_dtype, kv_gib=self.kv_gib, gpu=gpu,
                                               gpu_memory_utilization=self.gpu_memory_utilization, num_gpus=self.tp)
        draft_layers = DRAFT_KV_LAYERS[self.spec_method] if self.spec_tokens else 0
        if draft_layers and self.kv_slots is None:
            # the draft layer's KV shares every block (vLLM's KV-cache group): a slot is (L + 1) / L as large
            capacity_slots = capacity_slots * model.num_layers // (model.num_layers + draft_layers)
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
        if capacity_slots > MAX_SLOTS:
            raise ValueError(f"the KV pool of {capacity_slots} slots exceeds {MAX_SLOTS} (int32 slot ids); "
                             f"lower --kv-gib/--kv-slots")
        if self.block_size > capacity_slots:
            raise ValueError(f"block_size ({self.block_size} tokens) exceeds the KV pool ({capacity_slots} slots)")
        swap_slots = int(self.swap_gib * GIB // kv_bytes_per_token) if self.preemption == "swap" else 0
        if swap_slots > MAX_SLOTS:
            raise ValueError(f"swap_gib = {self.swap_gib} is {swap_slots} slots, more than {MAX_SLOTS} "
                             f"(int32 slot ids); lower --swap-gib")
        state = self._state_sizes(model, capacity_slots)
        unit_layers = model.unit_layers(self.hybrid == "on")
        layer_groups = tuple((g.window_tokens, g.num_layers // unit_layers) for g in model.groups(self.hybrid == "on"))
        resolved = Resolved(
            model=model, gpu=gpu, capacity_slots=capacity_slots, swap_slots=swap_slots,
            max_num_batched_tokens=max_batched, kv_bytes_per_token=kv_bytes_per_token,
            kernel_heads=self.kernel_heads or model.num_kv_heads,
            layer_groups=layer_groups if model.is_hybrid and self.hybrid == "on" else (), state=state,
        )
        _check_host_memory(self, resolved)
        return resolved

    def _state_sizes(self, model: ModelPreset, capacity_slots: int) -> StateSizes | None:
        """A recurrent model's state in the pool, and what runs with one are built for (docs/recurrent.md)."""
        if not model.has_state:
            if self.state_checkpoints != "none" or self.state_cache_gib is not None:
                raise ValueError(f"state_checkpoints / state_cache_gib apply to recurrent layers: model {model.name} "
                                 f"has none")
            return None
        for flag, value, neutral in (("n", self.n, 1), ("beam_width", self.beam_width, 1),
                                     ("spec_tokens", self.spec_tokens, 0), ("preemption", self.preemption, "recompute"),
                                     ("host_cache_gib", self.host_cache_gib, 0.0),
                                     ("shared_tier_gib", self.shared_tier_gib, 0.0),
                                     ("prefill_replicas", self.prefill_replicas, 0)):
            if value != neutral:
                raise ValueError(f"{flag} {value} with model {model.name}: a recurrent state is overwritten in place "
                                 f"and copying, moving or rolling it back is not built; leave {flag} at {neutral}")
        if self.replicas > 1:
            raise ValueError(f"replicas {self.replicas} with model {model.name}: a fleet of replicas holding "
                             f"recurrent state is not built; leave replicas at 1")
        if self.state_checkpoints == "none" and self.state_cache_gib is not None:
            raise ValueError("state_cache_gib bounds checkpoint memory: with state_checkpoints none there is none")
        sizes = state_sizes(model, self.kv_dtype, self.block_size, capacity_slots, self.state_cache_gib,
                            self.unify_page_size)
        return sizes if self.state_checkpoints != "none" else sizes._replace(cache_blocks=0)

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
    # (window_tokens or None, units) per layer group when per-group allocation applies (--hybrid on with a
    # hybrid model; docs/hybrid.md), else (); a paged pool then counts capacity_slots × sum(units) unit slots
    layer_groups: tuple[tuple[int | None, int], ...] = ()
    state: StateSizes | None = None  # a recurrent model's state in the pool (docs/recurrent.md); None without one

    @property
    def kernel_head_dim(self) -> int:
        """Width of one row of the kernel's pool: a head's, or a latent layout's kv_lora_rank + qk_rope_head_dim
        (one row shared by every head; `kernel_heads` is then 1)."""
        m = self.model
        return m.kv_lora_rank + m.qk_rope_head_dim if m.kv_layout == "latent" else m.head_dim


# Host bytes per KV block held by a strategy's arrays (reference counts, free stack, scratch), an upper bound;
# the compiled step loop of plain `paged` runs works on the same arrays (workbench.engine.compiled_paged).
ALLOCATOR_BYTES_PER_BLOCK = 32
STORAGE_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# Host bytes per request of the workload: its columns, the request log and the rows on their way to the tables
# (measured: 10^6 requests map ~130 MB more than 10^5 do)
REQUEST_BYTES = 256


def host_memory_parts(cfg: RunConfig, res: Resolved) -> dict[str, int]:
    """What a run allocates up front in host memory, in bytes, by part (parts of 0 bytes left out): the
    strategy's per-block arrays, and unless the kernel is off or on a
    GPU the kernel layer's K and V pools, device and swap; once per replica (prefill and decode replicas
    alike). With a kernel, the host tier's K and V (per replica) and the shared tier's (once: one pool for the
    fleet). With `--num-requests`, the workload's requests (once: one workload for the fleet)."""
    engines = cfg.num_engines
    blocks = (res.capacity_slots + res.swap_slots) // cfg.block_size + 1
    per_block = ALLOCATOR_BYTES_PER_BLOCK
    row_bytes = res.kernel_heads * res.kernel_head_dim * STORAGE_ITEMSIZE[cfg.kv_dtype]
    host_tier_rows = _tier_slots(cfg.host_cache_gib, res)
    if cfg.kernel in ("numba", "auto"):  # auto is counted as the CPU backend: the safe side on a GPU machine
        pool_rows, tier_rows = res.capacity_slots + res.swap_slots, host_tier_rows
    elif cfg.kernel == "cupy":
        pool_rows, tier_rows = res.swap_slots, host_tier_rows
    else:
        pool_rows = tier_rows = 0
    parts = {
        "allocator arrays": engines * blocks * per_block,
        f"K/V pools ({res.kernel_heads} kernel heads)": engines * 2 * pool_rows * row_bytes,
        "host tiers' K/V": engines * 2 * tier_rows * row_bytes,
        "the shared tier's K/V": 2 * _tier_slots(cfg.shared_tier_gib, res) * row_bytes if cfg.kernel != "none" else 0,
        "requests": (cfg.num_requests or 0) * REQUEST_BYTES,
    }
    return {part: size for part, size in parts.items() if size}


def host_memory_bytes(cfg: RunConfig, res: Resolved) -> int:
    """The sum of `host_memory_parts`."""
    return sum(host_memory_parts(cfg, res).values())


# what lowers each part of host_memory_parts
_REMEDY = {"allocator arrays": "--kv-gib/--kv-slots or raise --block-size",
           "K/V pools": "--kv-gib/--kv-slots, --kernel-heads, or use --kernel none",
           "host tiers' K/V": "--host-cache-gib, or use --kernel none",
           "the shared tier's K/V": "--shared-tier-gib, or use --kernel none",
           "requests": "--num-requests"}


def _tier_slots(gib: float, res: Resolved) -> int:
    """Token slots of a prefix cache's host or shared tier of `gib` GiB (the kernel runner keeps their K
    and V in host memory)."""
    return int(gib * GIB // res.kv_bytes_per_token)


# Address space a run maps after its configuration is checked, besides the arrays counted above: the rest of
# the engine's modules, Numba's threads and compiled kernels, the workload and the tables' chunks (measured:
# 0.3 GiB without a kernel, 0.5 GiB with the Numba kernel)
ADDRESS_SPACE_HEADROOM_BYTES = 3 * GIB // 4


def available_memory_bytes() -> int | None:
    """What this process can still allocate: the smaller of MemAvailable (/proc/meminfo: what the machine can
    give without swapping) and the room left under the process's address-space limit (RLIMIT_AS, less the
    address space already mapped and ADDRESS_SPACE_HEADROOM_BYTES). None where neither is known."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # POSIX only

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        limited = soft != resource.RLIM_INFINITY and soft > 0
    except (ImportError, OSError, ValueError):
        limited = False
    if limited:
        limits.append(max(0, soft - _mapped_bytes() - ADDRESS_SPACE_HEADROOM_BYTES))
    return min(limits) if limits else None


def _mapped_bytes() -> int:
    """The process's mapped address space (VmSize of /proc/self/status), 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_host_memory(cfg: RunConfig, res: Resolved) -> None:
    parts = host_memory_parts(cfg, res)
    need = sum(parts.values())
    available = available_memory_bytes()
    if available is None or need <= available:
        return
    largest = max(parts, key=parts.get)
    remedy = next(text for part, text in _REMEDY.items() if largest.startswith(part))
    pools = f"{cfg.num_engines} KV pools" if cfg.num_engines > 1 else "the KV pool"
    listed = ", ".join(f"{part} {size / GIB:.3g} GiB" for part, size in parts.items())
    raise ValueError(f"{pools} of {res.capacity_slots} slots need{'s' if cfg.num_engines == 1 else ''} "
                     f"{need / GIB:.3g} GiB of host memory ({listed}), but this process can allocate "
                     f"{available / GIB:.3g} GiB (the smaller of the machine's available memory and its address-space "
                     f"limit); lower {remedy}")
