"""Model KV geometries and GPUs as plain data, looked up by name (docs/memory.md).

`kv_bytes_per_token = 2 (K and V) × num_layers × num_kv_heads × head_dim × dtype_bytes`.

Hybrid models (docs/hybrid.md) split their layers into groups: full-attention layers read every token,
sliding-window layers only the last `window_tokens`. A group's bytes per token are the same formula
over its layers; the groups' layers add up to `num_layers`, so their bytes add up to the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import reduce

GIB = 2**30

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# A fleet's shared KV tier is reached over the datacenter network: one 200 Gb/s RDMA NIC port (ConnectX-6/7
# at 200 Gb/s, the per-GPU NIC of common H100/H200 clusters runs 200-400 Gb/s) moves 25 GB/s one way.
DEFAULT_SHARED_LINK_GB_S = 25.0
# Disaggregated prefill/decode ships a prompt's KV from a prefill GPU to a decode GPU over the same kind of
# NIC: one 200 Gb/s RDMA port per GPU (Mooncake's and vLLM's NIXL transfers run over GPUDirect RDMA), 25 GB/s.
DEFAULT_KV_LINK_GB_S = 25.0
# Far above any real model, low enough that sizes and modeled step times stay finite and in int64.
MODEL_LIMITS = {"num_layers": 2**16, "num_heads": 2**16, "num_kv_heads": 2**16, "head_dim": 2**16,
                "max_model_len": 2**31 - 1, "params_b": 1e6, "vocab_size": 2**24}

# CUDA virtual memory: what mapping one physical page into one layer's K or V buffer costs in vAttention
# (Prabhu et al., ASPLOS '25, arXiv 2405.04437v3, Table 3, µs per call at 2 MB pages: cuMemAddressReserve 2,
# cuMemCreate 29, cuMemMap 2, cuMemSetAccess 38, cuMemUnmap 34, cuMemRelease 23, cuMemAddressFree 1).
# vAttention creates its physical pages once, up front (`reserve_physical_pages` -> `cuMemCreate`), and maps
# each page a step needs with cuMemMap + cuMemSetAccess (`map_cuda_pages` in microsoft/vattention's
# vattention/cudaInternal.h); an unmapped page goes back to its free list, not to cuMemRelease. So a
# mapping costs 2 + 38 µs. The table's 64 KB to 256 KB columns (vAttention's own driver calls) are not in
# this table yet: page sizes without a measurement take the nearest measured size's figure (docs/strategies.md).
VMM_MAP_US_BY_PAGE_KIB = {2048: 2.0 + 38.0}


def vmm_map_us_per_page(page_kib: int) -> float:
    """µs to map one page of `page_kib` KiB into one buffer: the measurement at the nearest measured page
    size (nearest in log2 of the size; the larger size on a tie)."""
    nearest = min(VMM_MAP_US_BY_PAGE_KIB, key=lambda kib: (abs(math.log2(kib / page_kib)), -kib))
    return VMM_MAP_US_BY_PAGE_KIB[nearest]


@dataclass(frozen=True)
class LayerGroup:
    """Layers sharing one attention pattern: `window_tokens` None is full attention, W a sliding
    window (a query at position p reads positions [p − W + 1, p])."""

    num_layers: int
    window_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"layer group: num_layers must be >= 1, got {self.num_layers}")
        if self.window_tokens is not None and self.window_tokens < 1:
            raise ValueError(f"layer group: window_tokens must be >= 1 or None, got {self.window_tokens}")

    @property
    def label(self) -> str:
        return "full" if self.window_tokens is None else f"window{self.window_tokens}"


@dataclass(frozen=True)
class ModelPreset:
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    params_b: float  # billions of parameters
    max_model_len: int
    # () means one full-attention group of every layer; otherwise the groups' layers sum to num_layers
    layer_groups: tuple[LayerGroup, ...] = ()
    # The operator shapes the clock charges (workbench.clock.operators): the residual stream's width
    # (None: num_heads × head_dim), the vocabulary (embedding rows and output-layer columns), whether the
    # output layer reuses the embedding matrix, and whether the MLP is gated (SwiGLU / GeGLU: up, gate and
    # down matrices) or plain (OPT: up and down). The MLP's size is what params_b leaves.
    hidden_size: int | None = None
    vocab_size: int = 32000
    tied_embeddings: bool = False
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "max_model_len", "vocab_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"model {self.name!r}: {field} must be >= 1, got {getattr(self, field)}")
        for field, limit in MODEL_LIMITS.items():
            if getattr(self, field) > limit:
                raise ValueError(f"model {self.name!r}: {field} must be <= {limit}, got {getattr(self, field)}")
        if self.hidden_size is not None and not 1 <= self.hidden_size <= 2**20:
            raise ValueError(f"model {self.name!r}: hidden_size must be in [1, 2**20] or None, got {self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if not self.params_b > 0:
            raise ValueError(f"model {self.name!r}: params_b must be > 0, got {self.params_b}")
        if self.layer_groups and sum(g.num_layers for g in self.layer_groups) != self.num_layers:
            raise ValueError(f"model {self.name!r}: layer groups hold {sum(g.num_layers for g in self.layer_groups)} "
                             f"layers, the model has {self.num_layers}")

    @property
    def hidden(self) -> int:
        """Width of the residual stream (the embedding's)."""
        return self.num_heads * self.head_dim if self.hidden_size is None else self.hidden_size

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers attend through a sliding window."""
        return any(g.window_tokens is not None for g in self.layer_groups)

    def groups(self, hybrid: bool = True) -> tuple[LayerGroup, ...]:
        """The layer groups; with `hybrid` False (or no groups) one full-attention group of every layer,
        as a system without per-group allocation sees the model."""
        if hybrid and self.layer_groups:
            return self.layer_groups
        return (LayerGroup(self.num_layers),)

    def window_layer_fracs(self) -> tuple[tuple[int, float], ...]:
        """(window tokens, fraction of the layers) of each sliding-window group: what the clock charges
        min(context, W) keys (`step_cost`), whatever the allocation (`--hybrid`)."""
        return tuple((g.window_tokens, g.num_layers / self.num_layers) for g in self.layer_groups
                     if g.window_tokens is not None)

    def group_kv_bytes_per_token(self, group: LayerGroup, kv_dtype: str = "fp16") -> int:
        return 2 * group.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def unit_layers(self, hybrid: bool = True) -> int:
        """Layers per pool slot: the gcd of the groups' layer counts, so every group's KV for one token is
        a whole number of slots of the same size (vLLM v1 gives all groups one page size in bytes)."""
        return reduce(math.gcd, (g.num_layers for g in self.groups(hybrid)))

    def weight_bytes(self, weight_dtype: str = "fp16") -> int:
        return int(self.params_b * 1e9) * dtype_bytes(weight_dtype)


@dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_gib: float
    hbm_gb_s: float  # GB/s, 1e9 bytes per second
    peak_tflops: float  # dense fp16/bf16 TFLOP/s
    host_link_gb_s: float = 32.0  # GB/s host->device, one direction of the GPU's host interconnect
    gpu_link_gb_s: float = 300.0  # GB/s GPU->GPU, one direction of its NVLink (tensor parallelism's all-reduces)


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in [
        # hidden_size, vocab_size, tie_word_embeddings and the MLP's kind from each model's Hugging Face config.json
        ModelPreset("opt-13b", 40, 40, 40, 128, 12.85, 2048,
                    hidden_size=5120, vocab_size=50272, tied_embeddings=True, gated_mlp=False),
        ModelPreset("opt-66b", 64, 72, 72, 128, 65.7, 2048,
                    hidden_size=9216, vocab_size=50272, tied_embeddings=True, gated_mlp=False),
        ModelPreset("opt-175b", 96, 96, 96, 128, 175.0, 2048,
                    hidden_size=12288, vocab_size=50272, tied_embeddings=True, gated_mlp=False),
        ModelPreset("llama-2-7b", 32, 32, 32, 128, 6.74, 4096, vocab_size=32000),
        ModelPreset("llama-2-13b", 40, 40, 40, 128, 13.0, 4096, vocab_size=32000),
        ModelPreset("llama-2-70b", 80, 64, 8, 128, 69.0, 4096, vocab_size=32000),
        ModelPreset("llama-3-8b", 32, 32, 8, 128, 8.03, 8192, vocab_size=128256),
        ModelPreset("mistral-7b", 32, 32, 8, 128, 7.24, 32768, vocab_size=32768),
        ModelPreset("qwen2.5-7b", 28, 28, 4, 128, 7.62, 32768, hidden_size=3584, vocab_size=152064),
        # Hybrid presets, from the models' Hugging Face config.json files (num_hidden_layers,
        # num_attention_heads, num_key_value_heads, head_dim, sliding_window, layer_types /
        # sliding_window_pattern, max_position_embeddings):
        # huggingface.co/openai/gpt-oss-20b: 24 layers alternating sliding(128)/full, 64 heads, 8 KV, dim 64
        ModelPreset("gpt-oss-20b", 24, 64, 8, 64, 20.9, 131072,
                    (LayerGroup(12, 128), LayerGroup(12)), hidden_size=2880, vocab_size=201088),
        # huggingface.co/openai/gpt-oss-120b: 36 layers alternating sliding(128)/full, 64 heads, 8 KV, dim 64
        ModelPreset("gpt-oss-120b", 36, 64, 8, 64, 116.8, 131072,
                    (LayerGroup(18, 128), LayerGroup(18)), hidden_size=2880, vocab_size=201088),
        # huggingface.co/google/gemma-3-27b-it (text_config): 62 layers, sliding_window 1024, every 6th
        # layer global (sliding_window_pattern 6: 52 local + 10 global), 32 heads, 16 KV, dim 128
        ModelPreset("gemma-3-27b", 62, 32, 16, 128, 27.4, 131072,
                    (LayerGroup(52, 1024), LayerGroup(10)), hidden_size=5376, vocab_size=262208,
                    tied_embeddings=True),
        # huggingface.co/google/gemma-2-9b: 42 layers alternating sliding(4096)/global, 16 heads, 8 KV, dim 256
        ModelPreset("gemma-2-9b", 42, 16, 8, 256, 9.24, 8192,
                    (LayerGroup(21, 4096), LayerGroup(21)), hidden_size=3584, vocab_size=256000,
                    tied_embeddings=True),
        # huggingface.co/mistralai/Mistral-7B-v0.1: every layer sliding_window 4096, 32 heads, 8 KV, dim 128
        ModelPreset("mistral-7b-v0.1", 32, 32, 8, 128, 7.24, 32768,
                    (LayerGroup(32, 4096),), vocab_size=32000),
    ]
}

GPUS: dict[str, GpuPreset] = {
    g.name: g
    for g in [
        # host link: one direction of PCIe, the datasheets' bidirectional figure halved. A100 40/80 GB
        # (SXM and PCIe): "PCIe Gen4: 64 GB/s" (NVIDIA A100 Tensor Core GPU datasheet, 2021); H100 SXM:
        # "PCIe Gen5: 128 GB/s" (NVIDIA H100 Tensor Core GPU datasheet, 2023); H200: "PCIe Gen5:
        # 128 GB/s" (NVIDIA H200 Tensor Core GPU product brief, 2024). GPU link: one direction of NVLink,
        # the same datasheets' bidirectional "NVLink: 600 GB/s" (A100 SXM) and "900 GB/s" (H100 SXM, H200) halved
        GpuPreset("a100-40gb", 40, 1555, 312, 32.0, 300.0),
        GpuPreset("a100-80gb", 80, 2039, 312, 32.0, 300.0),
        GpuPreset("h100-sxm", 80, 3350, 989, 64.0, 450.0),
        GpuPreset("h200", 141, 4800, 989, 64.0, 450.0),
    ]
}

_CUSTOM_KEYS = {
    "layers": "num_layers",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "params_b": "params_b",
    "max_model_len": "max_model_len",
    "hidden": "hidden_size",
    "vocab": "vocab_size",
}


def dtype_bytes(kv_dtype: str) -> int:
    try:
        return DTYPE_BYTES[kv_dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {kv_dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def model_from_name(name: str) -> ModelPreset:
    """A preset by name, or a custom geometry written
    `custom:layers=40,heads=40,kv_heads=40,head_dim=128,params_b=13,max_model_len=2048`."""
    if name.startswith("custom:"):
        return _parse_custom(name)
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)} or 'custom:...'") from None


def gpu_from_name(name: str) -> GpuPreset:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown gpu {name!r}; expected one of {sorted(GPUS)}") from None


def _parse_custom(spec: str) -> ModelPreset:
    values: dict[str, float] = {}
    for item in spec.removeprefix("custom:").split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _CUSTOM_KEYS:
            raise ValueError(f"custom model {spec!r}: bad item {item!r}; expected key=value with keys "
                             f"{sorted(_CUSTOM_KEYS)}")
        try:
            values[_CUSTOM_KEYS[key]] = float(value)
        except ValueError:
            raise ValueError(f"custom model {spec!r}: {key} must be a number, got {value!r}") from None
        if not math.isfinite(values[_CUSTOM_KEYS[key]]):
            raise ValueError(f"custom model {spec!r}: {key} must be a finite number, got {value!r}")
    missing = [k for k, f in _CUSTOM_KEYS.items() if f not in values and k not in ("heads", "params_b", "max_model_len",
                                                                                    "hidden", "vocab")]
    if missing:
        raise ValueError(f"custom model {spec!r}: missing {missing}")
    ints = {f: int(v) for f, v in values.items() if f != "params_b"}
    for f, v in values.items():
        if f != "params_b" and v != int(v):
            raise ValueError(f"custom model {spec!r}: {f} must be an integer, got {v}")
    ints.setdefault("num_heads", ints["num_kv_heads"])
    ints.setdefault("max_model_len", 4096)
    return ModelPreset(name=spec, params_b=values.get("params_b", 7.0), **ints)


def with_max_model_len(model: ModelPreset, max_model_len: int | None) -> ModelPreset:
    return model if max_model_len is None else replace(model, max_model_len=max_model_len)


def kv_capacity_slots(
    model: ModelPreset,
    kv_dtype: str = "fp16",
    *,
    kv_gib: float | None = None,
    gpu: GpuPreset | None = None,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_gib: float = 1.0,
    num_gpus: int = 1,
) -> int:
    """KV capacity in token slots: floor(kv_bytes / kv_bytes_per_token).

    kv_bytes is `kv_gib × 2^30` when given, else `num_gpus × (gpu_memory × utilization − activations)
    − weights`: under tensor parallelism each GPU holds its share of the weights and of every block.
    """
    if kv_gib is not None:
        if not kv_gib > 0:
            raise ValueError(f"kv_gib must be > 0, got {kv_gib}")
        kv_bytes = kv_gib * GIB
    else:
        if gpu is None:
            raise ValueError("either kv_gib or gpu must be given")
        kv_bytes = num_gpus * (gpu.memory_gib * gpu_memory_utilization - activation_reserve_gib) * GIB
        kv_bytes -= model.weight_bytes()
        if kv_bytes <= 0:
            gpus = f"{num_gpus} × {gpu.name}" if num_gpus > 1 else gpu.name
            raise ValueError(
                f"model {model.name} ({model.weight_bytes() / GIB:.1f} GiB of weights) leaves no KV memory "
                f"on {gpus} ({gpu.memory_gib} GiB × {gpu_memory_utilization} each)"
            )
    return math.floor(kv_bytes / model.kv_bytes_per_token(kv_dtype))
