"""The clock's operators beside Vidur's profiled kernels (docs/clock-profiles.md).

Vidur (Agrawal et al., MLSys 2024) profiles each operator of a decoder layer on real GPUs at row counts
1-4096; `data/vidur_ops.csv` holds its median times for Llama-2-7B on an A100 (80 GB) and an H100 and for
Llama-3-8B on an A100. Its attention profiles are not in the published repository snapshot this table
was cut from, so the comparison covers a layer less its attention: the four projections (`linear`)
and the element-wise kernels (`elementwise`: two norms, rope, the activation, two residual adds).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pandas as pd

from workbench.clock.roofline import RooflineClock, operator_s
from workbench.presets import GPUS, MODELS

DATA = Path(__file__).with_name("data") / "vidur_ops.csv"  # the 10 row counts per pair the operator fit reads
# every profiled row count from 1 to 4,096 per pair (the same cut rule), all graded by the paper table
DATA_ALL = Path(__file__).with_name("data") / "vidur_ops_all.csv"
GPU_PRESETS = {"a100": "a100-80gb", "h100": "h100-sxm"}  # Vidur's a100 is the 80 GB SXM part
LINEAR = {"qkv_proj": "attn_pre_proj", "o_proj": "attn_post_proj", "mlp_up": "mlp_up_proj",
          "mlp_down": "mlp_down_proj"}
# the clock's element-wise operators and the profiled kernels (one per layer each; two norms and two adds)
ELEMENTWISE = {"norm": ("input_layernorm", "post_attention_layernorm"), "rope": ("attn_rope",),
               "activation": ("mlp_act",), "residual_add": ("add", "add")}
GROUPS = ("linear", "elementwise")
# fitted on, by `python -m workbench.paper.fit_operators`; the other (gpu, model) pairs are predictions
FIT_ON = ("a100", "llama-2-7b")
# the roofline profile's default efficiencies, which the operator constants were fitted under
EFF_BW, EFF_FLOPS = 0.8, 0.75


@cache
def profiled(path: Path = DATA) -> pd.DataFrame:
    """Vidur's median ms per operator, one row per (gpu, model, num_tokens)."""
    return pd.read_csv(path, comment="#")


def profiled_layer_ms(row) -> dict[str, float]:
    """A profiled row's group times per layer, ms."""
    return {"linear": sum(row[c] for c in LINEAR.values()),
            "elementwise": sum(row[c] for cols in ELEMENTWISE.values() for c in cols)}


def clock_for(gpu: str, model: str) -> RooflineClock:
    m = MODELS[model]
    return RooflineClock(m, GPUS[GPU_PRESETS[gpu]], m.kv_bytes_per_token("fp16"), 16, eff_bw=EFF_BW,
                         eff_flops=EFF_FLOPS, step_overhead_s=0.0)


def group_operators(clock: RooflineClock, group: str):
    names = LINEAR if group == "linear" else ELEMENTWISE
    return [op for op in clock.forward.per_row if op.name in names]


def layer_op_s(clock: RooflineClock, op, rows: int, flops_per_s: float | None = None, **constants) -> float:
    """A layer operator's time in one decoder layer (the model-wide operator over the layers), at the
    clock's GEMM rate for `rows` rows unless `flops_per_s` is given; `constants` override `operator_s`'s."""
    rate = clock.gemm_flops_per_s(rows) if flops_per_s is None else flops_per_s
    return operator_s(op, rows, clock.bytes_per_s, rate, clock.tp, **constants) / clock.forward.layers


def modeled_layer_ms(clock: RooflineClock, rows: int) -> dict[str, float]:
    """The clock's group times per layer at `rows` rows, ms."""
    return {g: 1e3 * sum(layer_op_s(clock, op, rows) for op in group_operators(clock, g)) for g in GROUPS}


def comparison(path: Path = DATA) -> pd.DataFrame:
    """Per (gpu, model, num_tokens) of the profile at `path`: Vidur's and the clock's group times per layer
    (ms) and their ratio; `fitted` marks the pair the constants were fitted on."""
    out = []
    for (gpu, model), rows in profiled(path).groupby(["gpu", "model"], sort=False):
        clock = clock_for(gpu, model)
        for _, row in rows.iterrows():
            vidur, ours = profiled_layer_ms(row), modeled_layer_ms(clock, int(row["num_tokens"]))
            vidur["layer"], ours["layer"] = sum(vidur.values()), sum(ours.values())
            for group in (*GROUPS, "layer"):
                out.append({"gpu": gpu, "model": model, "num_tokens": int(row["num_tokens"]), "group": group,
                            "vidur_ms": vidur[group], "clock_ms": ours[group],
                            "ratio": ours[group] / vidur[group], "fitted": (gpu, model) == FIT_ON})
    return pd.DataFrame(out)
