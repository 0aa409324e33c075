"""What a workload looks like before any simulation: size, time span, rates, lengths and prefix sharing.

Prefix-sharing potential at block size B: cut every request's sequence (prompt, then the answer of
sample 0) into full B-token blocks from position 0. A full block of a prompt *hits* when the whole
prefix up to that block's end appeared, as full blocks, in an earlier-arriving request's sequence.
potential = B × (prompt blocks that hit) / (all prompt tokens): the share of prompt tokens an unlimited
prefix cache (automatic prefix caching over hash chains, nothing ever evicted) would serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.workload.build import Workload
from workbench.workload.request import Request, Segment, mix64

DEFAULT_BLOCK_SIZE = 16
PEAK_BINS_S = (1.0, 60.0)
_MASK63 = (1 << 63) - 1


@dataclass(frozen=True)
class PrefixSharing:
    block_size: int
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_frac(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefix_sharing(requests: list[Request], block_size: int = DEFAULT_BLOCK_SIZE) -> PrefixSharing:
    """Prefix-sharing potential of `requests` (in arrival order) at `block_size`, as the module says."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    seg_req, seg_start, seg_len, seg_key, seg_prefix = [], [], [], [], []
    for index, r in enumerate(requests):
        prefix = 0  # digest of the segments before the current one: equal digests = equal token prefixes
        start = 0
        for seg in (*r.content, Segment(r.output_key, r.output_tokens)):
            seg_req.append(index)
            seg_start.append(start)
            seg_len.append(seg.length)
            seg_key.append(seg.key)
            seg_prefix.append(prefix)
            prefix = hash((prefix, seg.key, seg.length)) & _MASK63
            start += seg.length
    start = np.array(seg_start, dtype=np.int64)  # [num_segments] position of each segment's first token
    end = start + np.array(seg_len, dtype=np.int64)
    per_seg = end // block_size - start // block_size  # [num_segments] block ends inside each segment
    seg = np.repeat(np.arange(len(start)), per_seg)  # [num_blocks] segment holding each block's last token
    first_end = (start // block_size + 1) * block_size
    rank = np.arange(len(seg)) - np.repeat(np.cumsum(per_seg) - per_seg, per_seg)
    block_end = first_end[seg] + rank * block_size  # [num_blocks] position just past each full block
    # The prefix [0, block_end) is fixed by (segments before, this segment's key, offset into it).
    offset = (block_end - start[seg]).astype(np.uint64)
    keyed = mix64(np.array(seg_prefix, dtype=np.uint64)[seg] ^ np.array(seg_key, dtype=np.uint64)[seg])
    with np.errstate(over="ignore"):
        block_id = mix64(keyed + offset)  # [num_blocks]
    block_req = np.array(seg_req, dtype=np.int64)[seg]
    prompt_tokens = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
    in_prompt = block_end <= prompt_tokens[block_req]
    _, first, inverse = np.unique(block_id, return_index=True, return_inverse=True)
    hit = in_prompt & (block_req[first[inverse]] < block_req)
    return PrefixSharing(block_size, int(prompt_tokens.sum()), int(hit.sum()) * block_size)


def peak_rate(arrival_s: np.ndarray, bin_s: float) -> float:
    """Requests per second in the busiest bin of width `bin_s` (bins start at t = 0)."""
    counts = np.bincount((arrival_s // bin_s).astype(np.int64))
    return float(counts.max()) / bin_s


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
        f"{'tokens':<15} {'mean':>9} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'total':>14}",
    ]
    for name, values in (("prompt", prompt), ("output", output)):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        lines.append(f"  {name:<13} {values.mean():>9.2f} {p50:>8.0f} {p90:>8.0f} {p99:>8.0f} {values.max():>8,} "
                     f"{values.sum():>14,}")
    lines.append(f"sampling        n = {requests[0].n}, beam width = {requests[0].beam_width} (every request)")
    lines.append(f"prefix sharing  {100 * sharing.hit_frac:.1f}% of prompt tokens ({sharing.hit_tokens:,} of "
                 f"{sharing.prompt_tokens:,}) would hit an unlimited prefix cache at block size {block_size}")
    lines += [f"note            {note}" for note in workload.notes]
    return "\n".join(lines)
