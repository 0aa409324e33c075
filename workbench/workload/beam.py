"""Beam search as a deterministic fork/prune process that the engine follows (vLLM's beam search).

A request with `beam_width` W > 1 runs for `output_tokens` decode steps; all beams have that length
(no early stop).
- step 0: the prompt, prefilled once, is forked into W beams that share every prompt block (reference
  count W); beam i appends token_ids[i]. `parents` is (0,) * W.
- step s >= 1: each of the W live beams b proposes W candidate tokens c = 0..W-1, each with a score
  drawn from (seed, request_id, s, b, c) alone. The W best of the W*W candidates survive (higher score
  first, ties by b then c); survivor i is a fork of beam `parents[i]` plus `token_ids[i]`. A beam that is
  the parent of k survivors is forked k - 1 times (its blocks shared, copy-on-write on the first write
  into a shared, partly filled block); a beam that is nobody's parent is freed (`freed`).
- the answer is survivor 0 of the last step.
Scores are memoryless (independent of earlier steps), so `beam_step` is a pure function that needs no
beam state; ancestry still coalesces as in real beam search, which is what makes the sharing real.

`branch_frac` < 1 (`--beam-branch-frac`) makes only that fraction of steps >= 1 *branch* points (drawn
from (seed, request_id, step)); at the other steps every beam extends itself with its own best
candidate: no fork, no free. This is a language model that is sure of the next token at most steps,
so that each beam's own best continuation outscores the others' second choices; ancestry then
coalesces more slowly and beams share fewer blocks (notebook 06 compares it with the vLLM paper's
Fig. 15). The default 1 re-ranks at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.splitmix import mix64
from workbench.workload.request import VOCAB_SIZE, Request


@dataclass(frozen=True)
class BeamStep:
    parents: tuple[int, ...]  # [beam_width] beam of the previous step that each survivor extends
    token_ids: tuple[int, ...]  # [beam_width] token appended to each survivor
    freed: tuple[int, ...]  # beams of the previous step that no survivor extends (their blocks are released)


BRANCH_SALT = np.uint64(0xB5A9C3D1E7F20B17)  # keys the branch draw apart from the candidates' scores


def beam_step(request: Request, step: int, seed: int, branch_frac: float = 1.0) -> BeamStep:
    """Survivors of decode step `step` (0-based) of `request`'s beam search; pure, as the module says."""
    width = request.beam_width
    if width < 2:
        raise ValueError(f"request {request.request_id} has beam_width {width}: not a beam search")
    if not 0 <= step < request.output_tokens:
        raise ValueError(f"request {request.request_id}: step {step} outside 0..{request.output_tokens - 1}")
    live = 1 if step == 0 else width  # beams of the previous step
    base = mix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    with np.errstate(over="ignore"):
        base = mix64(base + np.uint64(request.request_id))
        base = mix64(base + np.uint64(step))
        score = mix64(base + np.arange(live * width, dtype=np.uint64))  # [live * width], candidate b*W+c
    if step > 0 and branch_frac < 1.0:
        draw = float(mix64(base ^ BRANCH_SALT)[0] >> np.uint64(11)) / 2.0**53  # uniform in [0, 1)
        if draw >= branch_frac:  # not a branch point: beam b keeps its own best candidate
            own = score.reshape(live, width)  # [beams, candidates]
            tokens = (own.max(axis=1) % np.uint64(VOCAB_SIZE)).astype(np.int64).tolist()
            return BeamStep(tuple(range(width)), tuple(tokens), ())
    best = np.lexsort((np.arange(live * width), ~score))[:width]  # score descending, ties by (b, c)
    parents = (best // width).tolist()
    tokens = (score[best] % np.uint64(VOCAB_SIZE)).astype(np.int64).tolist()
    freed = tuple(b for b in range(live) if b not in parents)
    return BeamStep(tuple(parents), tuple(tokens), freed)
