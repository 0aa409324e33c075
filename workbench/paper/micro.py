"""The paper's microbenchmarks (Figs. 18a and 19a, §7.3) on the `vllm-sosp23-a100` clock alone.

No simulation: each figure is the clock's charge for the operation the artifact's benchmark timed
(OPT-13B on one A100-40GB). The swap and per-block attention constants were fitted to Figs. 19a and
18a (`workbench.paper.fit_block_costs`); the recomputation is the profile's prompt-only iteration, with
the overhead the profile charges a prompt iteration (fitted with the decode overhead to Fig. 13).
"""

from __future__ import annotations

from workbench.clock.profiles import PROFILES, make_clock
from workbench.clock.roofline import RooflineClock
from workbench.clock.step_cost import StepCost
from workbench.config import RunConfig
from workbench.paper.fit_block_costs import BLOCK_SIZES, KERNEL_BLOCK_SIZE, SWAP_TOKENS, fit_kernel
from workbench.presets import MODELS

PROFILE = "vllm-sosp23-a100"


def opt13b_clock(block_size: int) -> RooflineClock:
    cfg = RunConfig(model="opt-13b", gpu="a100-40gb", clock_profile=PROFILE)
    return make_clock(cfg, cfg.resolve(), block_size, paged_kernel=True)


def _decode_step(swapped_blocks: int) -> StepCost:
    """One sequence decoding at one token of context, moving `swapped_blocks` blocks over the host link."""
    return StepCost(num_prefill_tokens=0, num_decode_tokens=1, kv_read_tokens=1, attn_query_ctx=1,
                    decode_ctx_tokens=1, unshared_block_slots=0, num_running=1, copied_blocks=0,
                    swapped_blocks=swapped_blocks, decode_blocks=0)


def swap_in_out_s(block_size: int, tokens: int = SWAP_TOKENS) -> float:
    """Swapping `tokens` out and back in: what the swaps add to a step (Fig. 19a's "swap in + out")."""
    clock = opt13b_clock(block_size)
    blocks = 2 * (tokens // block_size)  # out, then in
    return clock.cost_s(_decode_step(blocks)) - clock.cost_s(_decode_step(0))


def recompute_s(tokens: int = SWAP_TOKENS) -> float:
    """Recomputing a preempted request of `tokens`: its prompt-only iteration (no block-size term), with the
    overhead the profile charges a prompt iteration."""
    prompt = StepCost(num_prefill_tokens=tokens, num_decode_tokens=0, kv_read_tokens=tokens,
                      attn_query_ctx=tokens * (tokens + 1) // 2, decode_ctx_tokens=0, unshared_block_slots=0,
                      num_running=1, copied_blocks=0, swapped_blocks=0, decode_blocks=0)
    return opt13b_clock(KERNEL_BLOCK_SIZE).cost_s(prompt)


def crossover_block_size() -> int:
    """The smallest of Fig. 19a's block sizes at which swapping in and out is faster than recomputing
    (0 when none is)."""
    recompute = recompute_s()
    return next((b for b in BLOCK_SIZES if swap_in_out_s(b) < recompute), 0)


def recompute_over_swap_max() -> float:
    """The largest ratio of recomputation to swapping over Fig. 19a's block sizes."""
    recompute = recompute_s()
    return max(recompute / swap_in_out_s(b) for b in BLOCK_SIZES)


def paged_attention_extra_s(batch: int, context: int) -> float:
    """vLLM's paged kernel minus a contiguous one (Fig. 18a, one layer): the profile's cost per block
    visit (a block, a query head, a sequence) plus the fitted per-launch cost."""
    launch_s, _, _ = fit_kernel()
    visits = batch * (context // KERNEL_BLOCK_SIZE) * MODELS["opt-13b"].num_heads
    return launch_s + PROFILES[PROFILE].attn_s_per_block * visits
