"""Clock profiles (`--clock-profile`, docs/clock-profiles.md): named sets of the roofline clock's constants.

`roofline` (the default) takes `--eff-bw`, `--eff-flops` and `--step-overhead-s` from the run's
flags: datasheet bandwidth and peak scaled by what well-tuned kernels sustain, plus 1 ms of engine
work per step. A calibrated profile fixes all three (and the GPU it was fitted on) to values fitted
to a published system's measurements, and may add the costs that system measured per KV block (its
attention kernel's per-block cost, its swap's host link and per-copy cost); the fits, their points
and residuals are in docs/clock-profiles.md and `python -m workbench.paper.fit_clock` reruns the
step-time fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workbench.clock.roofline import RooflineClock


@dataclass(frozen=True)
class ClockProfile:
    name: str
    summary: str
    gpus: tuple[str, ...] = ()  # the GPU presets it holds on: the one it was fitted on and its siblings (empty: any)
    eff_bw: float | None = None  # None: the run's flag
    eff_flops: float | None = None
    step_overhead_s: float | None = None
    separate_prefill: bool = False  # prompts and decodes in separate iterations (RooflineClock)
    prefill_overhead_s: float | None = None  # a prompt iteration's overhead under separate_prefill (None: step's)
    host_link_gbps: float | None = None  # GB/s host<->device, one direction, as copies achieve it (None: the GPU's)
    swap_s_per_transfer: float = 0.0  # fixed cost of one host<->device copy (one block of one layer's K or V)
    attn_s_per_block: float = 0.0  # decode attention's fixed cost per KV block, query head and layer


PROFILES: dict[str, ClockProfile] = {p.name: p for p in (
    ClockProfile("roofline", "the run's --eff-bw, --eff-flops and --step-overhead-s on the GPU's datasheet figures"),
    # Fitted to the vLLM paper (Kwon et al., SOSP 2023): OPT-13B on one A100-40GB, vLLM 0.1 with
    # PyTorch eager kernels and a Python scheduler, so each step costs far more than the roofline.
    # The paper also serves OPT-175B on A100-80GBs: the same chip, software and link, so the same
    # efficiencies and overheads (with that GPU's own memory and bandwidth).
    # eff_bw is the weight-streaming efficiency of Vidur's profiled A100 layers at 1-32 rows; the decode and
    # prompt iterations' overheads were fitted at it to the paged batches of Fig. 13 (workbench.paper.fit_clock).
    # Per-block costs (docs/clock-profiles.md): the swap link and per-copy cost fitted to Fig. 19a
    # (swapping 256 tokens in and out at block sizes 1-256), the attention cost per block visit to
    # Fig. 18a (the paged kernel at block 16 against FasterTransformer's contiguous one).
    ClockProfile("vllm-sosp23-a100", "fitted to the vLLM paper's OPT-13B / A100-40GB measurements "
                 "(docs/clock-profiles.md)", gpus=("a100-40gb", "a100-80gb"), eff_bw=0.80, eff_flops=0.75,
                 step_overhead_s=0.030, prefill_overhead_s=0.012, separate_prefill=True, host_link_gbps=12.4,
                 swap_s_per_transfer=2.57e-6, attn_s_per_block=1.6e-9),
)}

PROFILE_NAMES = tuple(PROFILES)
# the flags a calibrated profile fixes
PROFILE_FLAGS = ("eff_bw", "eff_flops", "step_overhead_s")


def check_profile(cfg) -> None:
    """One ValueError when a calibrated profile meets flags it fixes or another GPU."""
    profile = PROFILES[cfg.clock_profile]
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for flag in PROFILE_FLAGS:
        if getattr(profile, flag) is not None and getattr(cfg, flag) != defaults[flag]:
            raise ValueError(f"clock_profile {profile.name} fixes {flag} "
                             f"({getattr(profile, flag)}); drop {flag} or use clock_profile roofline")
    if profile.gpus and cfg.gpu not in profile.gpus:
        raise ValueError(f"clock_profile {profile.name} was fitted on gpu {' or '.join(profile.gpus)}, not {cfg.gpu}")


def make_clock(cfg, res, block_size: int, map_s_per_page: float = 0.0, overlap_map: bool = False, *,
               paged_kernel: bool, overlap_load: bool = False, shared_link_gb_s: float = 0.0) -> RooflineClock:
    """The run's clock: the profile's constants where it fixes them, the flags elsewhere; page mapping
    costs come from the strategy (`allocators.base.page_map_cost`). The per-block attention cost is
    the paged kernel's (`paged_kernel`: the strategy's kernel addresses blocks); a contiguous kernel
    reads each sequence's KV as one extent."""
    profile = PROFILES[cfg.clock_profile]

    def pick(flag: str) -> float:
        value = getattr(profile, flag)
        return getattr(cfg, flag) if value is None else value

    return RooflineClock(res.model, res.gpu, res.kv_bytes_per_token, block_size, eff_bw=pick("eff_bw"),
                         eff_flops=pick("eff_flops"), step_overhead_s=pick("step_overhead_s"),
                         separate_prefill=profile.separate_prefill, map_s_per_page=map_s_per_page,
                         overlap_map=overlap_map, host_link_gbps=profile.host_link_gbps,
                         swap_s_per_transfer=profile.swap_s_per_transfer,
                         attn_s_per_block=profile.attn_s_per_block if paged_kernel else 0.0, tp=cfg.tp,
                         prefill_overhead_s=profile.prefill_overhead_s,
                         overlap_load=overlap_load, shared_link_gb_s=shared_link_gb_s)
