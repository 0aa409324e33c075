"""What a workload looks like before any simulation: size, time span, rates, lengths and prefix sharing.

Prefix-sharing potential at block size B: cut every request's sequence (prompt, then the answer of
sample 0) into full B-token blocks from position 0. A full block of a prompt *hits* when the whole
prefix up to that block's end appeared, as full blocks, in an earlier-arriving request's sequence.
potential = B × (prompt blocks that hit) / (all prompt tokens): the share of prompt tokens an unlimited
prefix cache (automatic prefix caching over hash chains, nothing ever evicted) would serve.

The infinite-cache bound applies the prefix caches' rule on top (at least one prompt token is
computed, so at most (prompt - 1) // B blocks hit): it is the upper bound of a run's
`prefix_hit_rate` for every prefix cache (`paged-prefix`, `radix`) at that block size when no request
is preempted (a request recomputed after preemption hits its own blocks again, which counts twice),
reached when nothing is evicted and each request finishes before the next that shares with it arrives. It is
computed from segments (for Mooncake: the trace's hash ids), never from token ids or hash chains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.workload.build import Workload
from workbench.workload.request import Request, Segment

DEFAULT_BLOCK_SIZE = 16
PEAK_BINS_S = (1.0, 60.0)
_MASK63 = (1 << 63) - 1


@dataclass(frozen=True)
class PrefixSharing:
    block_size: int
    prompt_tokens: int
    hit_tokens: int
    bound_tokens: int  # hit tokens with at least one prompt token computed: the infinite-cache bound

    @property
    def hit_frac(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def bound_frac(self) -> float:
        return self.bound_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefix_sharing(requests: list[Request], block_size: int = DEFAULT_BLOCK_SIZE) -> PrefixSharing:
    """Prefix-sharing potential of `requests` (in arrival order) at `block_size`, as the module says.

    Works on segments, not tokens: a segment's tokens depend only on (key, offset), so the token
    prefix up to offset o of a segment is fixed by (the segments before it, its key, o). An earlier
    sequence that holds the same (segments before, key) up to offset L covers, as full blocks, every
    block of this one that ends inside the segment at an offset <= L (both start at the same position).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    longest: dict[tuple[int, int], int] = {}  # (digest of segments before, key) -> longest earlier length
    hit_blocks = 0
    bound_blocks = 0
    prompt_tokens = 0
    for r in requests:
        digest = 0  # of the segments before the current one: equal digests = equal token prefixes
        start = 0
        seen_here = []
        for seg in (*r.content, Segment(r.output_key, r.output_tokens)):
            node = (digest, seg.key)
            hit_end = min(start + min(seg.length, longest.get(node, 0)), r.prompt_tokens)
            if hit_end > start:
                hit_blocks += hit_end // block_size - start // block_size  # block ends in (start, hit_end]
                bound_end = min(hit_end, r.prompt_tokens - 1)  # the last prompt token is always computed
                bound_blocks += max(bound_end // block_size - start // block_size, 0)
            seen_here.append((node, seg.length))
            digest = hash((digest, seg.key, seg.length)) & _MASK63
            start += seg.length
        for node, length in seen_here:  # visible to later requests only
            if length > longest.get(node, 0):
                longest[node] = length
        prompt_tokens += r.prompt_tokens
    return PrefixSharing(block_size, prompt_tokens, hit_blocks * block_size, bound_blocks * block_size)


def peak_rate(arrival_s: np.ndarray, bin_s: float) -> float:
    """Requests per second in the busiest bin of width `bin_s` (bins start at t = 0)."""
    counts = np.bincount((arrival_s // bin_s).astype(np.int64))
    return float(counts.max()) / bin_s


def interarrival_cv(arrival_s: np.ndarray) -> float:
    """Standard deviation over mean of the gaps between consecutive arrivals (NaN below two gaps or no spread)."""
    gaps = np.diff(arrival_s)
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")


def describe(workload: Workload, block_size: int = DEFAULT_BLOCK_SIZE) -> str:
    """The human-readable summary printed by `python -m workbench.workload describe`."""
    requests = workload.requests
    arrival_s = np.array([r.arrival_s for r in requests])  # [N]
    prompt = np.array([r.prompt_tokens for r in requests])
    output = np.array([r.output_tokens for r in requests])
    span_s = float(arrival_s[-1] - arrival_s[0])
    mean_rate = f"{len(requests) / span_s:.3f} req/s (requests / span)" if span_s > 0 else "n/a (one instant)"
    peaks = ", ".join(f"{peak_rate(arrival_s, b):.3g} req/s (busiest {b:g}-s bin)" for b in PEAK_BINS_S)
    sharing = prefix_sharing(requests, block_size)
    sessions = {r.session_id for r in requests if r.session_id is not None}
    lines = [
        f"workload        {workload.spec}  ({workload.source})",
        f"requests        {len(requests):,}" + (f" in {len(sessions):,} sessions" if sessions else ""),
        f"time span       {span_s:,.1f} s (first arrival at 0)",
        f"mean rate       {mean_rate}",
        f"peak rate       {peaks}",
        f"burstiness      inter-arrival CV {interarrival_cv(arrival_s):.2f} (1 = Poisson)",
        f"{'tokens':<15} {'mean':>9} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'total':>14}",
    ]
    for name, values in (("prompt", prompt), ("output", output)):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        lines.append(f"  {name:<13} {values.mean():>9.2f} {p50:>8.0f} {p90:>8.0f} {p99:>8.0f} {values.max():>8,} "
                     f"{values.sum():>14,}")
    lines.append(f"sampling        n = {requests[0].n}, beam width = {requests[0].beam_width} (every request)")
    lines.append(f"prefix sharing  {100 * sharing.hit_frac:.1f}% of prompt tokens ({sharing.hit_tokens:,} of "
                 f"{sharing.prompt_tokens:,}) would hit an unlimited prefix cache at block size {block_size}")
    lines.append(f"infinite cache  {100 * sharing.bound_frac:.1f}% of prompt tokens ({sharing.bound_tokens:,}): "
                 f"the bound of prefix_hit_rate at block size {block_size} (one prompt token always computed)")
    lines += [f"note            {note}" for note in workload.notes]
    return "\n".join(lines)
