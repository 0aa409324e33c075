"""Model KV geometries and GPUs as plain data, looked up by name (docs/memory.md).

`kv_bytes_per_token = 2 (K and V) × num_layers × num_kv_heads × head_dim × dtype_bytes` for models that
store per-head keys and values (`kv_layout` "heads"). Multi-head latent attention (`kv_layout` "latent",
DeepSeek-V2/V3, Kimi-K2) stores one compressed latent and one rotary key per token and layer, shared by
every query head: `num_layers × (kv_lora_rank + qk_rope_head_dim) × dtype_bytes`, no factor 2 (the latent
is both key and value). DeepSeek Sparse Attention adds its indexer's key, one per token and layer, to the
same token's bytes (`index_bytes_per_token_layer`).

Mixture-of-experts presets carry their routed and shared experts; the clock charges the active ones
(workbench.clock.operators) and `params_b` stays the total, which capacity subtracts as weights.

Hybrid models (docs/hybrid.md) split their layers into groups: full-attention layers read every token,
sliding-window layers only the last `window_tokens`. A group's bytes per token are the same formula
over its layers; the groups' layers add up to `num_layers`, so their bytes add up to the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import reduce
from typing import NamedTuple

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
                "max_model_len": 2**31 - 1, "params_b": 1e6, "vocab_size": 2**24, "kv_lora_rank": 2**16,
                "qk_rope_head_dim": 2**16, "q_lora_rank": 2**20, "index_heads": 2**16, "index_head_dim": 2**16,
                "num_experts": 2**16, "experts_per_token": 2**16, "num_shared_experts": 2**16,
                "expert_width": 2**20}
KV_LAYOUTS = ("heads", "latent")
WEIGHT_DTYPES = ("fp16", "bf16", "fp8")
# DeepSeek-V3.2's indexer quantizes each key to fp8 in blocks of 128 values with one fp32 scale per block
# (the reference inference code's Indexer keeps `k_cache` [.., head_dim] fp8 and `k_scale_cache`
# [.., head_dim // 128] fp32: deepseek-ai/DeepSeek-V3.2-Exp, inference/model.py).
INDEX_SCALE_BLOCK = 128
INDEX_SCALE_BYTES = 4

# CUDA virtual memory: what mapping one physical page into one layer's K or V buffer costs in vAttention
# (Prabhu et al., ASPLOS '25, arXiv 2405.04437v3, Table 3, µs per call at 2 MB pages: cuMemAddressReserve 2,
# cuMemCreate 29, cuMemMap 2, cuMemSetAccess 38, cuMemUnmap 34, cuMemRelease 23, cuMemAddressFree 1).
# vAttention creates its physical pages once, up front (`reserve_physical_pages` -> `cuMemCreate`), and maps
# each page a step needs with cuMemMap + cuMemSetAccess (`map_cuda_pages` in microsoft/vattention's
# vattention/cudaInternal.h); an unmapped page goes back to its free list, not to cuMemRelease. So a
# mapping costs 2 + 38 µs. The table's 64 KB to 256 KB columns (vAttention's own driver calls) are not in
# this table yet: page sizes without a measurement take the nearest measured size's figure (docs/strategies.md).
VMM_MAP_US_BY_PAGE_KIB = {2048: 2.0 + 38.0}


def dtype_bytes(kv_dtype: str) -> int:
    try:
        return DTYPE_BYTES[kv_dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {kv_dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def vmm_map_us_per_page(page_kib: int) -> float:
    """µs to map one page of `page_kib` KiB into one buffer: the measurement at the nearest measured page
    size (nearest in log2 of the size; the larger size on a tie)."""
    nearest = min(VMM_MAP_US_BY_PAGE_KIB, key=lambda kib: (abs(math.log2(kib / page_kib)), -kib))
    return VMM_MAP_US_BY_PAGE_KIB[nearest]


class AttentionTerm(NamedTuple):
    """A share of a step's attention for the cost meter (`workbench.clock.step_cost`): queries read and attend
    min(context, cap_tokens) keys (None: every key), weighted `read_frac` in KV bytes and `flop_frac` in
    FLOPs; `sparse`: the keys are any top-k of the context (a prefill chunk's queries may read all of it),
    not a window of the last ones."""

    cap_tokens: int | None
    read_frac: float
    flop_frac: float
    sparse: bool = False


# ---- recurrent layers ----------------------------------------------------------------------------
# A recurrent layer's mixer (docs/recurrent.md): its state per sequence, its parameters and its FLOPs.
#
# Gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba-2 (Nemotron-H) keep the same two tensors per sequence and
# layer, which vLLM allocates as one state page (`MambaStateShapeCalculator` in
# vllm/model_executor/layers/mamba/mamba_utils.py):
#
# - the causal convolution's last `conv_kernel − 1` inputs over `conv_dim = num_heads × head_dim +
#   2 × num_groups × state_dim` channels (Gated DeltaNet: values plus queries and keys; Mamba-2: x plus B and C);
# - the recurrent state, `num_heads × head_dim × state_dim` values (Gated DeltaNet: one d_v × d_k matrix per
#   value head; Mamba-2: one head_dim × d_state matrix per head).
#
# Both are overwritten in place every token: the state at position p exists only while the sequence stands at p,
# so a prefix-cache hit at p needs a copy taken then (a checkpoint). Field names follow the two families'
# config.json: Gated DeltaNet's linear_num_value_heads, linear_value_head_dim, linear_key_head_dim,
# linear_num_key_heads, linear_conv_kernel_dim; Mamba-2's mamba_num_heads, mamba_head_dim, ssm_state_size,
# n_groups, conv_kernel.
KINDS = ("gated-deltanet", "mamba2")
# FLOPs per token, head and state element of the recurrence itself (2 per multiply-add): Gated DeltaNet's delta
# rule reads S·k, adds the rank-one correction β(v − S·k)kᵀ and reads S·q (three d_v × d_k products); Mamba-2
# adds the rank-one dt·x·Bᵀ to the decayed state and reads h·C (two)
RECURRENCE_FLOPS_PER_ELEMENT = {"gated-deltanet": 6, "mamba2": 4}


@dataclass(frozen=True)
class RecurrentMixer:
    kind: str
    num_heads: int  # value heads (Gated DeltaNet) or heads (Mamba-2)
    head_dim: int  # their width: d_v, or Mamba-2's head_dim
    state_dim: int  # d_k (Gated DeltaNet) or d_state (Mamba-2)
    num_groups: int  # key heads (Gated DeltaNet) or B/C groups (Mamba-2)
    conv_kernel: int
    conv_dtype_bytes: int = 2  # the conv window's dtype (vLLM's mamba_cache_dtype "auto": the model's, bf16)
    state_dtype_bytes: int = 2  # the recurrent matrices' (vLLM's mamba_ssm_cache_dtype; float32 for some models)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"recurrent mixer: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        for field in ("num_heads", "head_dim", "state_dim", "num_groups", "conv_kernel", "conv_dtype_bytes",
                      "state_dtype_bytes"):
            if not 1 <= getattr(self, field) <= 2**16:
                raise ValueError(f"recurrent mixer: {field} must be in [1, 65536], got {getattr(self, field)}")
        if self.num_heads % self.num_groups:
            raise ValueError(f"recurrent mixer: num_heads ({self.num_heads}) must be a multiple of num_groups "
                             f"({self.num_groups})")

    @property
    def inner_dim(self) -> int:
        """Width of the values (and of the output before its projection)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner_dim + 2 * self.num_groups * self.state_dim

    @property
    def state_bytes(self) -> int:
        """One sequence's state in one layer (the preset's `state:BYTES`): the conv window and the recurrent
        matrices."""
        conv = (self.conv_kernel - 1) * self.conv_dim * self.conv_dtype_bytes
        return conv + self.num_heads * self.head_dim * self.state_dim * self.state_dtype_bytes

    def in_proj_width(self) -> int:
        """Outputs of the input projection: Gated DeltaNet's q, k, v, the output gate z and the per-head β and
        decay a; Mamba-2's x, the gate z, B, C and the per-head dt."""
        gates = 2 * self.num_heads if self.kind == "gated-deltanet" else self.num_heads
        return 2 * self.inner_dim + 2 * self.num_groups * self.state_dim + gates

    def params(self, hidden: int) -> int:
        """One layer's parameters: the input projection, the output projection and `local_params` (transformers'
        Qwen3NextGatedDeltaNet and NemotronHMamba2Mixer)."""
        return hidden * self.in_proj_width() + self.inner_dim * hidden + self.local_params

    @property
    def local_params(self) -> int:
        """The parameters outside the two projections: the depthwise conv, the per-head decay and step
        parameters and the gated norm's weights."""
        per_head = 2 * self.num_heads if self.kind == "gated-deltanet" else 3 * self.num_heads  # A, dt (and D)
        norm = self.head_dim if self.kind == "gated-deltanet" else self.inner_dim
        return self.conv_dim * self.conv_kernel + per_head + norm

    def recurrence_flops_per_token(self) -> float:
        """The conv and the recurrence for one token in one layer (the projections are GEMMs, counted apart)."""
        recurrence = RECURRENCE_FLOPS_PER_ELEMENT[self.kind] * self.num_heads * self.head_dim * self.state_dim
        return recurrence + 2.0 * self.conv_dim * self.conv_kernel


@dataclass(frozen=True)
class LayerGroup:
    """Layers sharing one attention pattern: `window_tokens` None is full attention, W a sliding
    window (a query at position p reads positions [p − W + 1, p]); with a `mixer` the layers are recurrent
    (docs/recurrent.md): no KV, a state of `mixer.state_bytes` per sequence each."""

    num_layers: int
    window_tokens: int | None = None
    mixer: RecurrentMixer | None = None

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"layer group: num_layers must be >= 1, got {self.num_layers}")
        if self.window_tokens is not None and self.window_tokens < 1:
            raise ValueError(f"layer group: window_tokens must be >= 1 or None, got {self.window_tokens}")
        if self.mixer is not None and self.window_tokens is not None:
            raise ValueError("layer group: a recurrent group has no attention window")

    @property
    def label(self) -> str:
        """The layer kind (`full`, `window:W`, `state:BYTES` per sequence and layer)."""
        if self.mixer is not None:
            return f"state:{self.mixer.state_bytes}"
        return "full" if self.window_tokens is None else f"window:{self.window_tokens}"


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
    # bytes per weight for capacity and the clock (docs/memory.md); `--weight-dtype` overrides it
    weight_dtype: str = "fp16"
    # Multi-head latent attention ("latent"): one row of kv_lora_rank + qk_rope_head_dim per token and layer,
    # shared by all num_heads query heads (num_kv_heads is 1); head_dim is then the per-head no-rope query
    # and value width, and q_lora_rank the query's compression (0: the query is projected directly).
    kv_layout: str = "heads"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    # DeepSeek Sparse Attention: the lightning indexer's heads and key width, its key cache's dtype, and the
    # tokens each query attends to (0 everywhere: dense attention)
    index_heads: int = 0
    index_head_dim: int = 0
    index_dtype: str = "fp8"
    index_topk: int = 0
    # Mixture of experts (0 experts: a dense MLP in every layer): routed experts per MoE layer, how many
    # each token is routed to, experts every token passes through, the leading layers that keep a dense
    # MLP, and one expert's inner width
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    expert_width: int = 0
    # the KV cache's dtype of a run (RunConfig.resolve sets it): what sparse attention's cost terms weigh the
    # latent rows against the indexer's keys with (`window_layer_fracs`)
    kv_dtype: str = "fp16"

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
        if self.layer_groups and self.attention_layers < 1:
            raise ValueError(f"model {self.name!r}: every layer is recurrent; at least one attention layer holds KV")
        if self.layer_groups and sum(g.num_layers for g in self.layer_groups) != self.num_layers:
            raise ValueError(f"model {self.name!r}: layer groups hold {sum(g.num_layers for g in self.layer_groups)} "
                             f"layers, the model has {self.num_layers}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"model {self.name!r}: weight_dtype {self.weight_dtype!r} is not one of "
                             f"{', '.join(WEIGHT_DTYPES)}")
        self._check_latent()
        self._check_indexer()
        self._check_experts()
        self._check_state()

    def _check_state(self) -> None:
        """Recurrent groups beside full attention only, and mixers that fit the stated parameters: a recurrent
        layer's projections follow from its state dims, so dims that do not belong to the model show here."""
        if not self.has_state:
            return
        if self.is_hybrid:
            raise ValueError(f"model {self.name!r}: recurrent layers beside sliding-window layers are not built")
        body = self.params_b * 1e9 - self.embedding_params
        if self.mixer_params > body:
            state = ", ".join(f"{g.num_layers} × {g.label}" for g in self.state_groups)
            raise ValueError(f"model {self.name!r}: its token mixers ({self.attention_layers} attention layers, "
                             f"recurrent {state}) hold {self.mixer_params / 1e9:.4g} B parameters, more than the "
                             f"{body / 1e9:.4g} B that params_b ({self.params_b}) leaves after the embeddings: "
                             f"the recurrent dims do not belong to this model")

    def _check_latent(self) -> None:
        for field in ("kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "index_heads", "index_head_dim",
                      "num_experts", "experts_per_token", "num_shared_experts", "num_dense_layers", "expert_width"):
            if getattr(self, field) < 0:
                raise ValueError(f"model {self.name!r}: {field} must be >= 0, got {getattr(self, field)}")
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"model {self.name!r}: kv_layout {self.kv_layout!r} is not one of {', '.join(KV_LAYOUTS)}")
        if self.kv_layout == "heads":
            if self.kv_lora_rank or self.qk_rope_head_dim or self.q_lora_rank:
                raise ValueError(f"model {self.name!r}: kv_lora_rank, qk_rope_head_dim and q_lora_rank describe a "
                                 f"latent KV layout; set kv_layout latent or leave them 0")
            return
        if self.kv_lora_rank < 1:
            raise ValueError(f"model {self.name!r}: kv_layout latent needs kv_lora_rank >= 1")
        if self.num_kv_heads != 1:
            raise ValueError(f"model {self.name!r}: a latent KV row is shared by every head: num_kv_heads must be 1, "
                             f"got {self.num_kv_heads}")
        if self.layer_groups:
            raise ValueError(f"model {self.name!r}: layer groups (sliding-window or recurrent) with a latent KV "
                             f"layout are not built")

    def _check_indexer(self) -> None:
        has_indexer = self.index_heads or self.index_head_dim
        if self.index_topk < 0:
            raise ValueError(f"model {self.name!r}: index_topk must be >= 1, got {self.index_topk}")
        if not has_indexer:
            if self.index_topk:
                raise ValueError(f"model {self.name!r}: index_topk {self.index_topk} without an indexer: set "
                                 f"index_heads and index_head_dim")
            return
        if not (self.index_heads and self.index_head_dim):
            raise ValueError(f"model {self.name!r}: an indexer needs both index_heads and index_head_dim >= 1")
        if self.kv_layout != "latent":
            raise ValueError(f"model {self.name!r}: an indexer (DeepSeek Sparse Attention) needs kv_layout latent")
        if self.index_topk == 0:
            raise ValueError(f"model {self.name!r}: an indexer without index_topk: set the tokens each query "
                             f"attends to (DeepSeek-V3.2: 2048)")
        if self.index_topk > self.max_model_len:
            raise ValueError(f"model {self.name!r}: index_topk ({self.index_topk}) exceeds max_model_len "
                             f"({self.max_model_len}): no query could select that many tokens")
        dtype_bytes(self.index_dtype)

    def _check_experts(self) -> None:
        if not self.num_experts:
            if self.experts_per_token or self.num_shared_experts or self.num_dense_layers or self.expert_width:
                raise ValueError(f"model {self.name!r}: experts_per_token, num_shared_experts, num_dense_layers and "
                                 f"expert_width need num_experts >= 1")
            return
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"model {self.name!r}: experts_per_token must be in [1, num_experts = "
                             f"{self.num_experts}], got {self.experts_per_token}")
        if self.expert_width < 1:
            raise ValueError(f"model {self.name!r}: a mixture of experts needs expert_width >= 1")
        if self.num_dense_layers >= self.num_layers:
            raise ValueError(f"model {self.name!r}: num_dense_layers ({self.num_dense_layers}) leaves no MoE layer "
                             f"of the {self.num_layers}")
        experts = self.moe_layers * (self.num_experts + self.num_shared_experts) * self.expert_params
        room = self.params_b * 1e9 - self.embedding_params - self.mixer_params
        if experts > room:
            raise ValueError(f"model {self.name!r}: {self.moe_layers} MoE layers × ({self.num_experts} + "
                             f"{self.num_shared_experts}) experts of width {self.expert_width} hold "
                             f"{experts / 1e9:.4g} B parameters, more than the {room / 1e9:.4g} B that params_b "
                             f"({self.params_b}) leaves after the embeddings, attention and recurrent layers")

    @property
    def hidden(self) -> int:
        """Width of the residual stream (the embedding's)."""
        return self.num_heads * self.head_dim if self.hidden_size is None else self.hidden_size

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> int:
        """Bytes one token's KV takes over all layers; under tensor parallelism a per-head layout splits
        them over the GPUs, a latent one is held whole by every GPU (`kv_replicated`)."""
        if self.kv_layout == "latent":
            latent = (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes(kv_dtype)
            return self.num_layers * (latent + self.index_bytes_per_token_layer)
        return 2 * self.attention_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    @property
    def kv_replicated(self) -> bool:
        """Whether every tensor-parallel GPU holds each token's whole KV: a latent row serves every head, so
        splitting the heads over GPUs does not split it (vLLM and SGLang replicate it likewise)."""
        return self.kv_layout == "latent"

    @property
    def index_bytes_per_token_layer(self) -> int:
        """The sparse-attention indexer's key for one token in one layer: index_head_dim values of
        index_dtype, plus one fp32 scale per 128 values when they are fp8 (0 without an indexer)."""
        if not self.index_head_dim:
            return 0
        scales = self.index_head_dim // INDEX_SCALE_BLOCK * INDEX_SCALE_BYTES if self.index_dtype == "fp8" else 0
        return self.index_head_dim * dtype_bytes(self.index_dtype) + scales

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts else 0

    @property
    def expert_params(self) -> int:
        """Parameters of one expert: up, gate and down matrices (up and down for a plain MLP)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.expert_width

    @property
    def embedding_params(self) -> int:
        """The embedding table, and the output layer when it is a second matrix."""
        return self.vocab_size * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def attention_params(self) -> int:
        """One layer's attention projections. Per-head: Q, K, V and O. Latent (DeepSeek-V2/V3's MLA): the query
        (through its q_lora_rank compression when there is one), the latent and rotary key from the hidden
        state, the latent's up-projection to every head's no-rope key and value, and O; plus the indexer's
        query (from the query's compression), key and per-head weights when it has one."""
        hidden, heads, d = self.hidden, self.num_heads, self.head_dim
        if self.kv_layout == "heads":
            return hidden * heads * d + 2 * hidden * self.num_kv_heads * d + heads * d * hidden
        q_width = heads * (d + self.qk_rope_head_dim)
        q = hidden * self.q_lora_rank + self.q_lora_rank * q_width if self.q_lora_rank else hidden * q_width
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * heads * 2 * d
        indexer = 0
        if self.index_heads:
            q_in = self.q_lora_rank or hidden
            indexer = (q_in * self.index_heads * self.index_head_dim + hidden * self.index_head_dim
                       + hidden * self.index_heads)
        return q + kv + heads * d * hidden + indexer

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers attend through a sliding window."""
        return any(g.window_tokens is not None for g in self.layer_groups)

    @property
    def state_groups(self) -> tuple[LayerGroup, ...]:
        """The recurrent layer groups (docs/recurrent.md); () for a model of attention layers only."""
        return tuple(g for g in self.layer_groups if g.mixer is not None)

    @property
    def has_state(self) -> bool:
        return bool(self.state_groups)

    @property
    def attention_layers(self) -> int:
        """Layers that attend (and hold KV): every layer but the recurrent ones."""
        return self.num_layers - sum(g.num_layers for g in self.state_groups)

    def state_bytes_per_seq(self) -> int:
        """One sequence's recurrent state over every recurrent layer (0 without recurrent layers)."""
        return sum(g.num_layers * g.mixer.state_bytes for g in self.state_groups)

    @property
    def mixer_params(self) -> int:
        """The token mixers' parameters: attention in the attention layers, the recurrent mixers in the others."""
        return (self.attention_layers * self.attention_params
                + sum(g.num_layers * g.mixer.params(self.hidden) for g in self.state_groups))

    def groups(self, hybrid: bool = True) -> tuple[LayerGroup, ...]:
        """The attention layer groups (recurrent ones hold no KV); with `hybrid` False (or no window groups)
        one full-attention group of every attention layer, as a system without per-group allocation sees it."""
        if hybrid and self.is_hybrid:
            return tuple(g for g in self.layer_groups if g.mixer is None)
        return (LayerGroup(self.attention_layers),)

    def window_layer_fracs(self) -> tuple[tuple, ...]:
        """The attention terms the step's cost meter charges beside full attention over every key
        (`workbench.clock.step_cost`), whatever the allocation (`--hybrid`): (window tokens, fraction of the
        layers) of each sliding-window group, read and attended min(context, W) keys; for sparse attention
        (DSA) the top-k term and the indexer's scan (`sparse_attention_terms`)."""
        if self.index_topk:
            return self.sparse_attention_terms()
        return tuple((g.window_tokens, g.num_layers / self.num_layers) for g in self.layer_groups
                     if g.window_tokens is not None)

    def sparse_attention_terms(self) -> tuple[AttentionTerm, AttentionTerm]:
        """DeepSeek Sparse Attention's two terms, in the clock's units (a key = one token's `kv_bytes_per_token`
        read, `attn_flops_per_key` FLOPs): each query reads and attends its top min(context, index_topk)
        latent rows, and the indexer reads and scores every key of its context."""
        latent = (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes(self.kv_dtype)
        index = self.index_bytes_per_token_layer
        # the indexer's FLOPs per key (one dot product of index_head_dim per index head) over attention's
        # (absorbed MLA: q·c and q_rope·k_rope, then p·c per head), both 2 flops per multiply-add
        index_flops = self.index_heads * self.index_head_dim
        attention_flops = self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return (AttentionTerm(self.index_topk, latent / (latent + index), 1.0, sparse=True),
                AttentionTerm(None, index / (latent + index), index_flops / attention_flops))

    def group_kv_bytes_per_token(self, group: LayerGroup, kv_dtype: str = "fp16") -> int:
        return 2 * group.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def unit_layers(self, hybrid: bool = True) -> int:
        """Layers per pool slot: the gcd of the groups' layer counts, so every group's KV for one token is
        a whole number of slots of the same size (vLLM v1 gives all groups one page size in bytes)."""
        return reduce(math.gcd, (g.num_layers for g in self.groups(hybrid)))

    def weight_bytes(self, weight_dtype: str | None = None) -> int:
        """All the parameters at `weight_dtype` (default: the preset's)."""
        return int(self.params_b * 1e9) * dtype_bytes(weight_dtype or self.weight_dtype)


@dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_gib: float
    hbm_gb_s: float  # GB/s, 1e9 bytes per second
    peak_tflops: float  # dense fp16/bf16 TFLOP/s
    host_link_gb_s: float = 32.0  # GB/s host->device, one direction of the GPU's host interconnect
    gpu_link_gb_s: float = 300.0  # GB/s GPU->GPU, one direction of its NVLink (tensor parallelism's all-reduces)


def _deepseek_v3(name: str, params_b: float, **indexer) -> ModelPreset:
    """DeepSeek-V3's geometry (config.json cited at the presets below), with or without an indexer."""
    return ModelPreset(name, 61, 128, 1, 128, params_b, 163840, hidden_size=7168, vocab_size=129280,
                       weight_dtype="fp8", kv_layout="latent", kv_lora_rank=512, qk_rope_head_dim=64,
                       q_lora_rank=1536, num_experts=256, experts_per_token=8, num_shared_experts=1,
                       num_dense_layers=3, expert_width=2048, **indexer)


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
        # huggingface.co/openai/gpt-oss-20b: 24 layers alternating sliding(128)/full, 64 heads, 8 KV, dim 64;
        # num_local_experts 32, experts_per_token 4, intermediate_size 2880 (one expert's width), every layer
        # MoE. params_b: 20.91 B total (OpenAI's gpt-oss model card, arXiv 2508.10925, Table 1). The experts
        # ship in MXFP4 (4.25 bits), which no weight dtype here matches: left at fp16, `--weight-dtype fp8`
        # comes closer.
        ModelPreset("gpt-oss-20b", 24, 64, 8, 64, 20.91, 131072,
                    (LayerGroup(12, 128), LayerGroup(12)), hidden_size=2880, vocab_size=201088,
                    num_experts=32, experts_per_token=4, expert_width=2880),
        # huggingface.co/openai/gpt-oss-120b: 36 layers alternating sliding(128)/full, 64 heads, 8 KV, dim 64;
        # num_local_experts 128, experts_per_token 4, intermediate_size 2880; 116.8 B total (model card: 116.83)
        ModelPreset("gpt-oss-120b", 36, 64, 8, 64, 116.8, 131072,
                    (LayerGroup(18, 128), LayerGroup(18)), hidden_size=2880, vocab_size=201088,
                    num_experts=128, experts_per_token=4, expert_width=2880),
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
        # Hybrids of attention and recurrent layers (docs/recurrent.md). Geometry from each model's config.json
        # (Qwen: num_hidden_layers, full_attention_interval / layer_types, num_attention_heads,
        # num_key_value_heads, head_dim, linear_num_value_heads, linear_value_head_dim, linear_key_head_dim,
        # linear_num_key_heads, linear_conv_kernel_dim, hidden_size, intermediate_size / num_experts,
        # num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size, vocab_size,
        # max_position_embeddings, tie_word_embeddings; Nemotron-H: hybrid_override_pattern, attention_head_dim,
        # mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel); the state dtypes as vLLM
        # allocates them (conv at the model's bf16; the recurrent matrices at the config's mamba_ssm_dtype
        # where it names one).
        # huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, every 4th full attention (12 full + 36
        # Gated DeltaNet), 16 heads, 2 KV, dim 256; linear 32 value heads of 128, 16 key heads of 128, conv 4;
        # hidden 2048, 512 experts (10 per token) + 1 shared of width 512, vocab 151936, 262144 tokens, untied,
        # bf16 state; 79.67 B parameters in the language model, its tensors summed (the model card rounds to 80 B)
        ModelPreset("qwen3-next-80b-a3b", 48, 16, 2, 256, 79.67, 262144,
                    (LayerGroup(12), LayerGroup(36, mixer=RecurrentMixer("gated-deltanet", 32, 128, 128, 16, 4))),
                    hidden_size=2048, vocab_size=151936, num_experts=512, experts_per_token=10,
                    num_shared_experts=1, expert_width=512),
        # huggingface.co/Qwen/Qwen3.5-27B (text_config): 64 layers, every 4th full attention (16 full + 48 Gated
        # DeltaNet), 24 heads, 4 KV, dim 256; linear 48 value heads of 128, 16 key heads of 128, conv 4; hidden
        # 5120, a dense gated MLP (intermediate 17408), vocab 248320, 262144 tokens, untied, mamba_ssm_dtype
        # float32; 26.9 B parameters in the language model (its tensors summed; 27.36 B with the vision tower)
        ModelPreset("qwen3.5-27b", 64, 24, 4, 256, 26.9, 262144,
                    (LayerGroup(16), LayerGroup(48, mixer=RecurrentMixer("gated-deltanet", 48, 128, 128, 16, 4,
                                                                         state_dtype_bytes=4))),
                    hidden_size=5120, vocab_size=248320),
        # huggingface.co/nvidia/Nemotron-H-8B-Base-8K: 52 layers in hybrid_override_pattern
        # "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-": 24 Mamba-2 ("M"), 4 attention ("*") and 24 MLP
        # ("-") layers. Here a layer is one token mixer and its MLP: 28 layers (4 attention + 24 Mamba-2) whose
        # MLPs share what the parameters leave (24 squared-ReLU MLPs of 21504, ungated). 32 heads, 8 KV,
        # attention_head_dim 128; Mamba-2 128 heads of 64, ssm_state_size 128, n_groups 8, conv 4; hidden 4096,
        # vocab 131072, 8192 tokens, untied; recurrent state float32 (vLLM's NemotronH config hook); 8.10 B
        # parameters (its tensors summed)
        ModelPreset("nemotron-h-8b", 28, 32, 8, 128, 8.10, 8192,
                    (LayerGroup(4), LayerGroup(24, mixer=RecurrentMixer("mamba2", 128, 64, 128, 8, 4,
                                                                        state_dtype_bytes=4))),
                    hidden_size=4096, vocab_size=131072, gated_mlp=False),
        # huggingface.co/Qwen/Qwen3.5-0.8B (text_config), the small hybrid of the tests: 24 layers, every 4th
        # full attention (6 full + 18 Gated DeltaNet), 8 heads, 2 KV, dim 256; linear 16 value heads of 128,
        # 16 key heads of 128, conv 4; hidden 1024, dense gated MLP (intermediate 3584), vocab 248320, 262144
        # tokens, tied embeddings, mamba_ssm_dtype float32; 0.752 B parameters in the language model
        ModelPreset("qwen3.5-0.8b", 24, 8, 2, 256, 0.752, 262144,
                    (LayerGroup(6), LayerGroup(18, mixer=RecurrentMixer("gated-deltanet", 16, 128, 128, 16, 4,
                                                                        state_dtype_bytes=4))),
                    hidden_size=1024, vocab_size=248320, tied_embeddings=True),
        # Latent-attention mixtures of experts. Geometry from each model's Hugging Face config.json:
        # num_hidden_layers, num_attention_heads, qk_nope_head_dim (= v_head_dim, our head_dim),
        # max_position_embeddings, hidden_size, vocab_size, kv_lora_rank, qk_rope_head_dim, q_lora_rank,
        # n_routed_experts, num_experts_per_tok, n_shared_experts, first_k_dense_replace (the dense layers),
        # moe_intermediate_size (expert width); the weights' dtype from its quantization_config
        # (fp8 e4m3, 128 × 128 blocks) or torch_dtype.
        # huggingface.co/deepseek-ai/DeepSeek-V3: 61 layers, 128 heads, 512 + 64 latent, q_lora 1536, 256 routed
        # experts (8 per token) + 1 shared of width 2048, 3 dense layers, 163840 tokens, fp8 weights;
        # 671 B parameters in the main model (the model card; the 14 B multi-token-prediction module apart)
        _deepseek_v3("deepseek-v3", 671.0),
        # huggingface.co/deepseek-ai/DeepSeek-R1: the same architecture and config.json as DeepSeek-V3
        _deepseek_v3("deepseek-r1", 671.0),
        # huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp: DeepSeek-V3's geometry plus the indexer's index_n_heads
        # 64, index_head_dim 128, index_topk 2048, keys cached in fp8 (inference/model.py); params: V3's 671 B
        # plus the indexer's projections (wq_b 1536 × 64·128, wk 7168 × 128, weights_proj 7168 × 64: 13.96 M
        # a layer, 0.85 B over 61 layers)
        _deepseek_v3("deepseek-v3.2", 671.85, index_heads=64, index_head_dim=128, index_dtype="fp8",
                     index_topk=2048),
        # huggingface.co/moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture with 64 heads, 384 routed
        # experts, 1 dense layer, vocab 163840, 131072 tokens, fp8 weights. params: its config's tensors summed
        # (embeddings 2.35 B, attention 6.17 B, 60 × 385 experts of 44.04 M = 1017.3 B, the dense MLP and the
        # routers 0.56 B) = 1026.4 B, the model card's "1T total parameters"
        ModelPreset("kimi-k2", 61, 64, 1, 128, 1026.4, 131072, hidden_size=7168, vocab_size=163840,
                    weight_dtype="fp8", kv_layout="latent", kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536,
                    num_experts=384, experts_per_token=8, num_shared_experts=1, num_dense_layers=1,
                    expert_width=2048),
        # huggingface.co/deepseek-ai/DeepSeek-V2-Lite: 27 layers, 16 heads, 512 + 64 latent, no q compression
        # (q_lora_rank null), 64 routed experts (6 per token) + 2 shared of width 1408, 1 dense layer,
        # hidden 2048, vocab 102400, 163840 tokens, bf16 weights; 15.7 B parameters (the model card)
        ModelPreset("deepseek-v2-lite", 27, 16, 1, 128, 15.7, 163840, hidden_size=2048, vocab_size=102400,
                    weight_dtype="bf16", kv_layout="latent", kv_lora_rank=512, qk_rope_head_dim=64,
                    num_experts=64, experts_per_token=6, num_shared_experts=2, num_dense_layers=1,
                    expert_width=1408),
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
    # a latent KV layout (kv_lora given: kv_layout latent, kv_heads 1 unless stated)
    "kv_lora": "kv_lora_rank",
    "rope_dim": "qk_rope_head_dim",
    "q_lora": "q_lora_rank",
    # a sparse-attention indexer (fp8 keys)
    "index_heads": "index_heads",
    "index_dim": "index_head_dim",
    "index_topk": "index_topk",
    # a mixture of experts
    "experts": "num_experts",
    "experts_per_token": "experts_per_token",
    "shared_experts": "num_shared_experts",
    "dense_layers": "num_dense_layers",
    "expert_width": "expert_width",
    # recurrent layers (docs/recurrent.md): how many, and their mixer's dims (Gated DeltaNet unless mamba2=1)
    "state_layers": "state_layers",
    "state_heads": "num_heads",
    "state_head_dim": "head_dim",
    "state_dim": "state_dim",
    "state_groups": "num_groups",
    "conv_kernel": "conv_kernel",
    "mamba2": "mamba2",
}
_MIXER_KEYS = ("state_heads", "state_head_dim", "state_dim", "state_groups", "conv_kernel", "mamba2")
_CUSTOM_REQUIRED = ("layers", "kv_heads", "head_dim")


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
    mixer: dict[str, float] = {}
    for item in spec.removeprefix("custom:").split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _CUSTOM_KEYS:
            raise ValueError(f"custom model {spec!r}: bad item {item!r}; expected key=value with keys "
                             f"{sorted(_CUSTOM_KEYS)}")
        try:
            (mixer if key in _MIXER_KEYS else values)[_CUSTOM_KEYS[key]] = float(value)
        except ValueError:
            raise ValueError(f"custom model {spec!r}: {key} must be a number, got {value!r}") from None
        if not math.isfinite(float(value)):
            raise ValueError(f"custom model {spec!r}: {key} must be a finite number, got {value!r}")
    if "kv_lora_rank" in values:
        values.setdefault("num_kv_heads", 1.0)
    missing = [k for k in _CUSTOM_REQUIRED if _CUSTOM_KEYS[k] not in values]
    if missing:
        raise ValueError(f"custom model {spec!r}: missing {missing}")
    for f, v in {**values, **mixer}.items():
        if f != "params_b" and v != int(v):
            raise ValueError(f"custom model {spec!r}: {f} must be an integer, got {v}")
    ints = {f: int(v) for f, v in values.items() if f not in ("params_b", "state_layers")}
    state_layers = int(values.get("state_layers", 0))
    if state_layers or mixer:
        ints["layer_groups"] = _custom_state_groups(spec, ints["num_layers"], state_layers, mixer)
    ints.setdefault("num_heads", ints["num_kv_heads"])
    ints.setdefault("max_model_len", 4096)
    latent = {"kv_layout": "latent"} if "kv_lora_rank" in ints else {}
    return ModelPreset(name=spec, params_b=values.get("params_b", 7.0), **latent, **ints)


def _custom_state_groups(spec: str, num_layers: int, state_layers: int, mixer: dict[str, float]) -> tuple:
    """A custom model's attention layers and its `state_layers` recurrent ones, all of the mixer's dims given."""
    missing = [k for k in _MIXER_KEYS[:-1] if _CUSTOM_KEYS[k] not in mixer]
    if not state_layers or missing:
        raise ValueError(f"custom model {spec!r}: recurrent layers need state_layers >= 1 and "
                         f"{', '.join(_MIXER_KEYS[:-1])}; missing {missing or ['state_layers']}")
    kind = "mamba2" if mixer.pop("mamba2", 0) else "gated-deltanet"
    if not 1 <= state_layers < num_layers:
        raise ValueError(f"custom model {spec!r}: state_layers must be in [1, layers - 1 = {num_layers - 1}], "
                         f"got {state_layers}")
    dims = {k: int(v) for k, v in mixer.items()}
    return (LayerGroup(num_layers - state_layers), LayerGroup(state_layers, mixer=RecurrentMixer(kind, **dims)))


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
    − weights` (the weights at the model's `weight_dtype`): under tensor parallelism each GPU holds its
    share of the weights and, with per-head K/V, its heads' share of every block. A latent KV row serves
    every head, so each GPU holds all of it (`ModelPreset.kv_replicated`): a token then takes
    `num_gpus × kv_bytes_per_token` of the GPUs' memory together, i.e. one GPU's KV memory, `gpu_memory ×
    utilization − activations − weights / num_gpus`, over `kv_bytes_per_token` (docs/memory.md).
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
    copies = num_gpus if model.kv_replicated else 1
    return math.floor(kv_bytes / (copies * model.kv_bytes_per_token(kv_dtype)))
