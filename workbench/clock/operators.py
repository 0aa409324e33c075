"""The operators of one forward pass: what each reads, writes and computes (docs/clock-profiles.md).

A decoder layer runs, for each of the step's rows (tokens): a norm, the QKV projection, the position
encoding (rope), attention with its KV-cache write, the output projection, a residual add, a norm, the
MLP's up (and gate) projection, its activation, its down projection and a residual add. Around the
layers: the embedding lookup (a gather: bytes, no FLOPs) and a final norm for every row, and the output
layer only for the rows that sample a token (an engine computes logits at each sequence's last position).

Sizes come from the model preset: the attention projections from the head geometry, the embedding and
output layer from the vocabulary and the residual width, and the MLP is what `params_b` leaves, so the
linear layers' FLOPs still add up to 2 × params × tokens (less the embedding, plus the output layer for
the sampled rows). Attention itself depends on the batch's context, not only its rows: the clock
charges it apart (`RooflineClock`).

A latent-attention model (MLA) projects the query (through its compression when it has one), the latent
and rotary key, and the latent's up-projection to the heads' keys and values: `ModelPreset.attention_params`
counts them, and the clock charges them as one projection.

A mixture of experts replaces the MLP of its MoE layers by `num_experts` routed experts, of which each row
passes through `experts_per_token`, and `num_shared_experts` that every row passes through; its first
`num_dense_layers` layers keep a dense MLP, the size of what `params_b` leaves. FLOPs count the active
experts only. A step reads the weights of the experts its rows touch: with routing taken as uniform and
independent per row, an expert is untouched by all `rows` rows with probability (1 − k/E)^rows, so a step
reads E·(1 − (1 − k/E)^rows) routed experts per MoE layer in expectation (k at one row, all E at large
batches); real routers are skewed, which touches fewer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ACTIVATION_BYTES = 2  # fp16 / bf16 activations
LOGIT_BYTES = 4  # the output layer writes fp32 logits


@dataclass(frozen=True)
class Operator:
    """One operator summed over the model's layers: `kernels` launches per forward pass, `weight_bytes`
    read once whatever the row count, `bytes_per_row` activations read and written and `flops_per_row`
    FLOPs per row. `split`: tensor parallelism divides it among the GPUs (the projections, rope, the
    activation: each GPU holds its heads' and its MLP columns' share); a replicated operator (norms,
    residual adds, the embedding lookup) runs whole on every GPU. `gemm`: a matrix multiply (its FLOP
    rate follows the row count); the others stream memory, at the rate small element-wise kernels reach."""

    name: str
    kernels: int
    weight_bytes: float
    bytes_per_row: float
    flops_per_row: float
    split: bool
    gemm: bool
    # routed experts: `weight_bytes` holds all `experts` of them, of which each row touches `experts_per_row`
    experts: int = 0
    experts_per_row: int = 0

    def weight_bytes_at(self, rows: int) -> float:
        """Weight bytes a step of `rows` rows reads: all of them, or for routed experts the expected share
        that its rows touch, 1 − (1 − k/E)^rows (uniform routing)."""
        if not self.experts:
            return self.weight_bytes
        return self.weight_bytes * -math.expm1(rows * math.log1p(-self.experts_per_row / self.experts)) \
            if self.experts_per_row < self.experts else self.weight_bytes


@dataclass(frozen=True)
class ForwardPass:
    """The model's operators: `per_row` run for every row of the step (the embedding and the final norm once,
    the others in every layer), `output` for the sampled rows only; `attention_kernels` the launches of
    attention and its KV-cache write."""

    per_row: tuple[Operator, ...]
    output: Operator
    layers: int
    attention_kernels: int
    mlp_params: float  # per layer: what params_b leaves after the attention projections and embeddings


def forward_pass(model, weight_dtype_bytes: int = 2) -> ForwardPass:
    """The operators of `model` (a workbench.presets.ModelPreset; not imported, so that the clock's modules
    stay one floor above the presets)."""
    layers, attn = model.num_layers, model.attention_layers
    hidden = model.hidden
    q_dim = model.num_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    a = ACTIVATION_BYTES
    w = weight_dtype_bytes
    embedding_params = model.vocab_size * hidden
    if model.kv_layout == "latent":
        # the query, latent and rotary key, and up-projections, with O apart; the query and output rows
        # are the heads' no-rope + rope query and value widths
        o_params = q_dim * hidden
        qkv_params = model.attention_params - o_params
        qkv_out = model.num_heads * (2 * model.head_dim + model.qk_rope_head_dim) + model.kv_lora_rank
    else:
        qkv_params = hidden * (q_dim + 2 * kv_dim)
        o_params = q_dim * hidden
        qkv_out = q_dim + 2 * kv_dim
    body_params = model.params_b * 1e9 - embedding_params * (1 if model.tied_embeddings else 2)
    if model.num_experts:
        return _moe_forward(model, w, embedding_params, qkv_params, qkv_out, o_params, body_params)
    # a custom geometry may state fewer parameters than its projections hold: no MLP then
    if model.has_state:
        mlp_params = max(0.0, (body_params - model.mixer_params) / layers)
    else:
        mlp_params = max(0.0, body_params / layers - qkv_params - o_params)
    up_share = 2 / 3 if model.gated_mlp else 1 / 2  # gated: up and gate are two of three equal matrices
    up_params, down_params = mlp_params * up_share, mlp_params * (1 - up_share)
    ffn = down_params / hidden  # the MLP's inner width
    up_out = ffn * (2 if model.gated_mlp else 1)

    def linear(name: str, params: float, inputs: float, outputs: float, n: int = layers) -> Operator:
        return Operator(name, n, n * params * w, n * (inputs + outputs) * a, n * 2.0 * params, split=True, gemm=True)

    def elementwise(name: str, kernels: int, row_bytes: float, split: bool) -> Operator:
        return Operator(name, kernels, 0.0, row_bytes, 0.0, split, gemm=False)

    per_row = (
        elementwise("embedding", 1, 2 * hidden * a, split=False),  # gather one row of the table, write it
        elementwise("final_norm", 1, 2 * hidden * a, split=False),
        elementwise("norm", 2 * layers, 2 * layers * 2 * hidden * a, split=False),
        linear("qkv_proj", qkv_params, hidden, q_dim + 2 * kv_dim, attn),
        elementwise("rope", attn, attn * 2 * (q_dim + kv_dim) * a, split=True),
        linear("o_proj", o_params, q_dim, hidden, attn),
        *recurrent_mixers(model, w),
        elementwise("residual_add", 2 * layers, 2 * layers * 3 * hidden * a, split=False),
        linear("mlp_up", up_params, hidden, up_out),
        # gated: read up and gate, write their product; plain: read and write the up projection
        elementwise("activation", layers, layers * (up_out + ffn) * a, split=True),
        linear("mlp_down", down_params, ffn, hidden),
    )
    output = Operator("output_layer", 1, embedding_params * w, hidden * a + model.vocab_size * LOGIT_BYTES,
                      2.0 * embedding_params, split=True, gemm=True)
    return ForwardPass(per_row, output, layers, attention_kernels=2 * attn, mlp_params=mlp_params)


def recurrent_mixers(model, w: int) -> tuple[Operator, ...]:
    """The recurrent layers' operators (docs/recurrent.md), per row: the input projection, the causal conv and
    the recurrence (its FLOPs grow with the rows, not the context: the state it reads and writes once per
    sequence and step is the clock's `state_bytes_per_seq`), and the output projection."""
    ops = []
    for g in model.state_groups:
        m, n, hidden, a = g.mixer, g.num_layers, model.hidden, ACTIVATION_BYTES
        in_params, out_params = hidden * m.in_proj_width(), m.inner_dim * hidden
        ops += [Operator("mixer_in_proj", n, n * in_params * w, n * (hidden + m.in_proj_width()) * a,
                         n * 2.0 * in_params, split=True, gemm=True),
                Operator("recurrence", 2 * n, n * m.local_params * w, n * (m.in_proj_width() + m.inner_dim) * a,
                         n * m.recurrence_flops_per_token(), split=True, gemm=False),
                Operator("mixer_out_proj", n, n * out_params * w, n * (m.inner_dim + hidden) * a,
                         n * 2.0 * out_params, split=True, gemm=True)]
    return tuple(ops)


def _moe_forward(model, w: int, embedding_params: float, qkv_params: float, qkv_out: float, o_params: float,
                 body_params: float) -> ForwardPass:
    """`forward_pass` of a mixture of experts: attention in every layer, a dense MLP (what params_b leaves) in
    the first num_dense_layers, shared and routed experts in the others."""
    layers, hidden, a = model.num_layers, model.hidden, ACTIVATION_BYTES
    attn = model.attention_layers
    q_dim = model.num_heads * model.head_dim
    moe, dense = model.moe_layers, model.num_dense_layers
    gated = 2 if model.gated_mlp else 1
    width = model.expert_width
    expert = model.expert_params
    experts_params = moe * (model.num_experts + model.num_shared_experts) * expert
    routers = moe * hidden * model.num_experts
    mixers = model.mixer_params if model.has_state else layers * (qkv_params + o_params)
    dense_mlp = max(0.0, body_params - mixers - experts_params - routers) / dense if dense else 0.0

    def linear(name: str, n: int, params: float, inputs: float, outputs: float) -> Operator:
        return Operator(name, n, n * params * w, n * (inputs + outputs) * a, n * 2.0 * params, split=True, gemm=True)

    def elementwise(name: str, kernels: int, row_bytes: float, split: bool) -> Operator:
        return Operator(name, kernels, 0.0, row_bytes, 0.0, split, gemm=False)

    k, shared = model.experts_per_token, model.num_shared_experts
    per_row = [
        elementwise("embedding", 1, 2 * hidden * a, split=False),
        elementwise("final_norm", 1, 2 * hidden * a, split=False),
        elementwise("norm", 2 * layers, 2 * layers * 2 * hidden * a, split=False),
        linear("qkv_proj", attn, qkv_params, hidden, qkv_out),
        elementwise("rope", attn, attn * 2 * qkv_out * a, split=True),
        linear("o_proj", attn, o_params, q_dim, hidden),
        *recurrent_mixers(model, w),
        elementwise("residual_add", 2 * layers, 2 * layers * 3 * hidden * a, split=False),
        # the router: one logit per routed expert
        linear("router", moe, routers / moe, hidden, model.num_experts),
        # every row's k routed experts: up (and gate), activation and down, grouped into one GEMM each
        Operator("routed_experts", 2 * moe, moe * model.num_experts * expert * w,
                 moe * k * (hidden + gated * width + width + hidden) * a, moe * k * 2.0 * expert,
                 split=True, gemm=True, experts=model.num_experts, experts_per_row=k),
        elementwise("expert_activation", moe, moe * k * (gated * width + width) * a, split=True),
    ]
    if shared:
        per_row.append(linear("shared_experts", moe, shared * expert, hidden, hidden))
    if dense:
        ffn = dense_mlp / ((gated + 1) * hidden)
        per_row += [linear("mlp_up", dense, dense_mlp * gated / (gated + 1), hidden, gated * ffn),
                    elementwise("activation", dense, dense * (gated * ffn + ffn) * a, split=True),
                    linear("mlp_down", dense, dense_mlp / (gated + 1), ffn, hidden)]
    output = Operator("output_layer", 1, embedding_params * w, hidden * a + model.vocab_size * LOGIT_BYTES,
                      2.0 * embedding_params, split=True, gemm=True)
    return ForwardPass(tuple(per_row), output, layers, attention_kernels=2 * attn, mlp_params=dense_mlp)
