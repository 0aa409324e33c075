"""Checkpoint policies for prefix caching of recurrent state (docs/recurrent.md), by name.

A recurrent layer's state is overwritten every token, so a prefix hit at position p needs a copy of the state
taken while the sequence stood at p: a checkpoint. Checkpoints sit at block boundaries (a hit covers whole
blocks) and are taken by the step that computes that position; a policy says which boundaries, and which
checkpoint goes first when memory runs short.

- `none`: no checkpoint, so no hit (vLLM without `mamba_cache_mode`: attention blocks cached, state not).
- `align` (vLLM `mamba_cache_mode=align`): boundaries a scheduling step ends on: a prefill chunk that ends on
  one, the prompt's last full block (vLLM splits the prefill there) and each block a decode step fills.
- `all` (vLLM `mamba_cache_mode=all`): every block boundary.
- `tree` (SGLang's MambaRadixCache): the state where each inserted sequence ends: the prompt's end after its
  prefill and the sequence's end when it finishes (at block granularity: the last full block of each).
- `marconi` (Pan et al., MLSys 2025): only where reuse is likely: a branch point, where a prompt leaves a
  prefix the cache already holds (shared input), and the end of the sequence (input + output, reused by the
  conversation's next turn); evicted by utility (`eviction_rank`).

`all`, `align` and `tree` evict the least recently used checkpoint first (vLLM's LRU over cached blocks;
SGLang's LRU over state-holding nodes, apart from the KV's).
"""

from __future__ import annotations

import numpy as np

POLICIES = ("none", "align", "all", "tree", "marconi")
# Marconi's utility: recency + α × FLOP efficiency, each min-max normalized over the checkpoints (its α is tuned
# per workload by a grid search; 1 weighs the two alike)
MARCONI_ALPHA = 1.0


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ValueError(f"unknown state checkpoint policy {name!r}; expected one of {', '.join(POLICIES)}")
    return name


def boundaries(policy: str, start: int, stop: int, block_size: int, prompt_len: int, final_len: int,
               branch: int) -> list[int]:
    """The block-boundary positions in (start, stop] whose state `policy` checkpoints, in order, for a step that
    computes positions [start, stop) of a sequence whose prompt has `prompt_len` tokens, whose final length is
    `final_len`, and whose prompt leaves the cached prefix at `branch` tokens (0: nowhere)."""
    bs = block_size
    first, last = start // bs + 1, stop // bs  # boundaries b·bs with start < b·bs <= stop
    if policy == "none" or first > last:
        return []
    if policy == "all":
        return [b * bs for b in range(first, last + 1)]
    wanted: set[int] = set()
    if policy == "align":
        wanted = {prompt_len - prompt_len % bs} | ({stop} if stop % bs == 0 else set())
    elif policy == "tree":
        wanted = {prompt_len - prompt_len % bs, final_len - final_len % bs}
    elif policy == "marconi":
        wanted = {branch, final_len - final_len % bs}
    return sorted(p for p in wanted if start < p <= stop and p > 0 and p % bs == 0)


def eviction_rank(policy: str, last_use: np.ndarray, flops_saved: np.ndarray) -> np.ndarray:
    """Order of eviction (first = next to go) of checkpoints with these last-use ticks and FLOPs their hit saves.
    LRU but for `marconi`: lowest recency + α × FLOP efficiency first (every checkpoint holds the same bytes, so
    FLOPs per byte orders as FLOPs), ties to the older."""
    if policy != "marconi" or last_use.shape[0] < 2:
        return np.argsort(last_use, kind="stable")
    utility = _unit(last_use.astype(np.float64)) + MARCONI_ALPHA * _unit(flops_saved)
    return np.lexsort((last_use, utility))


def _unit(x: np.ndarray) -> np.ndarray:
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)
