"""Clock profiles (`--clock-profile`, docs/clock-profiles.md): named sets of the roofline clock's constants.

`roofline` (the default) takes `--eff-bw`, `--eff-flops` and `--step-overhead-s` from the run's
flags: datasheet bandwidth and peak scaled by what well-tuned kernels sustain, plus 1 ms of engine
work per step. A calibrated profile fixes all three (and the GPU it was fitted on) to values fitted
to a published system's measurements; the fit, its points and residuals are in
docs/clock-profiles.md and `python -m workbench.paper.fit_clock` reruns it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workbench.clock import RooflineClock


@dataclass(frozen=True)
class ClockProfile:
    name: str
    summary: str
    gpu: str | None = None  # the GPU preset it was fitted on (None: any)
    eff_bw: float | None = None  # None: the run's flag
    eff_flops: float | None = None
    step_overhead_s: float | None = None
    separate_prefill: bool = False  # prompts and decodes in separate iterations (RooflineClock)


PROFILES: dict[str, ClockProfile] = {p.name: p for p in (
    ClockProfile("roofline", "the run's --eff-bw, --eff-flops and --step-overhead-s on the GPU's datasheet figures"),
    # Fitted to the vLLM paper (Kwon et al., SOSP 2023): OPT-13B on one A100-40GB, vLLM 0.1 with
    # PyTorch eager kernels and a Python scheduler, so each step costs far more than the roofline.
    ClockProfile("vllm-sosp23-a100", "fitted to the vLLM paper's OPT-13B / A100-40GB measurements "
                 "(docs/clock-profiles.md)", gpu="a100-40gb", eff_bw=0.55, eff_flops=0.75, step_overhead_s=0.016,
                 separate_prefill=True),
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
    if profile.gpu is not None and cfg.gpu != profile.gpu:
        raise ValueError(f"clock_profile {profile.name} was fitted on gpu {profile.gpu}, not {cfg.gpu}")


def make_clock(cfg, res, block_size: int, map_s_per_page: float = 0.0, overlap_map: bool = False,
               overlap_load: bool = False) -> RooflineClock:
    """The run's clock: the profile's constants where it fixes them, the flags elsewhere; page mapping
    costs come from the strategy (`allocators.base.page_map_cost`)."""
    profile = PROFILES[cfg.clock_profile]

    def pick(flag: str) -> float:
        value = getattr(profile, flag)
        return getattr(cfg, flag) if value is None else value

    return RooflineClock(res.model, res.gpu, res.kv_bytes_per_token, block_size, eff_bw=pick("eff_bw"),
                         eff_flops=pick("eff_flops"), step_overhead_s=pick("step_overhead_s"),
                         separate_prefill=profile.separate_prefill, map_s_per_page=map_s_per_page,
                         overlap_map=overlap_map, overlap_load=overlap_load)
