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
"""

from __future__ import annotations

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
    layers = model.num_layers
    hidden = model.hidden
    q_dim = model.num_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    a = ACTIVATION_BYTES
    w = weight_dtype_bytes
    embedding_params = model.vocab_size * hidden
    qkv_params = hidden * (q_dim + 2 * kv_dim)
    o_params = q_dim * hidden
    body_params = model.params_b * 1e9 - embedding_params * (1 if model.tied_embeddings else 2)
    # a custom geometry may state fewer parameters than its projections hold: no MLP then
    mlp_params = max(0.0, body_params / layers - qkv_params - o_params)
    up_share = 2 / 3 if model.gated_mlp else 1 / 2  # gated: up and gate are two of three equal matrices
    up_params, down_params = mlp_params * up_share, mlp_params * (1 - up_share)
    ffn = down_params / hidden  # the MLP's inner width
    up_out = ffn * (2 if model.gated_mlp else 1)

    def linear(name: str, params: float, inputs: float, outputs: float) -> Operator:
        return Operator(name, layers, layers * params * w, layers * (inputs + outputs) * a, layers * 2.0 * params,
                        split=True, gemm=True)

    def elementwise(name: str, kernels: int, row_bytes: float, split: bool) -> Operator:
        return Operator(name, kernels, 0.0, row_bytes, 0.0, split, gemm=False)

    per_row = (
        elementwise("embedding", 1, 2 * hidden * a, split=False),  # gather one row of the table, write it
        elementwise("final_norm", 1, 2 * hidden * a, split=False),
        elementwise("norm", 2 * layers, 2 * layers * 2 * hidden * a, split=False),
        linear("qkv_proj", qkv_params, hidden, q_dim + 2 * kv_dim),
        elementwise("rope", layers, layers * 2 * (q_dim + kv_dim) * a, split=True),
        linear("o_proj", o_params, q_dim, hidden),
        elementwise("residual_add", 2 * layers, 2 * layers * 3 * hidden * a, split=False),
        linear("mlp_up", up_params, hidden, up_out),
        # gated: read up and gate, write their product; plain: read and write the up projection
        elementwise("activation", layers, layers * (up_out + ffn) * a, split=True),
        linear("mlp_down", down_params, ffn, hidden),
    )
    output = Operator("output_layer", 1, embedding_params * w, hidden * a + model.vocab_size * LOGIT_BYTES,
                      2.0 * embedding_params, split=True, gemm=True)
    return ForwardPass(per_row, output, layers, attention_kernels=2 * layers, mlp_params=mlp_params)
