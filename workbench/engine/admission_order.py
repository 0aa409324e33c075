"""The order a replica tries its waiting groups in: `--schedule` (SGLang's `SchedulePolicy.calc_priority`,
docs/engine.md).

`fcfs` leaves the queue as it stands: arrival order, a group preempted by recompute at the front. Every other
order sorts the queue afresh before each admission pass, as SGLang sorts its waiting queue before each prefill
batch:

- `lpm`: the longest prefix the strategy's own cache holds first (`Strategy.prefix_match`: the prefix index
  and its tiers, read without recording a use), ties by arrival. The in-batch prefix check: a group with at
  most `in_batch_prefix_tokens` tokens cached whose first `in_batch_prefix_tokens` tokens a group that arrived
  before it shares (one not deferred itself) goes after all the others, so that of several waiting requests
  sharing a prefix the cache lacks one computes it first (SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and
  DEPRIORITIZE_THRESHOLD, both 32 tokens there). With more than `LPM_MAX_WAITING` groups waiting the queue is
  left as it stands, as SGLang does: matching every waiting prompt each step costs too much then.
- `dfs-weight`: depth-first over the strategy's radix tree. A node weighs the waiting groups whose match ends
  in its subtree; a node's children are visited heavier first (ties: the node created first), all of them
  before the groups whose match ends in the node itself (the deeper end first, then by arrival); groups
  matching nothing come last, by arrival.
- `lof`: the longest output first (the trace's output length: SGLang's max_new_tokens), ties by arrival.
- `random`: a shuffle drawn from the run's seed and the step (splitmix64), the same in every run of the seed.
"""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from workbench.allocators.base import Strategy
from workbench.engine.groups import Group
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.tokens import TokenStore
from workbench.splitmix import mix64

LPM_MAX_WAITING = 128  # SGLang's `_determine_active_policy`: above it, lpm falls back to the queue's order
_RANDOM_SALT = np.uint64(0x5C4ED0A1)  # keeps the order's draws apart from the other uses of the seed
_ROOT = -1  # the tree's root: no node id


def admission_order(strategy: Strategy, tokens: TokenStore, config: SchedulerConfig) -> AdmissionOrder | None:
    """The order of `config.schedule`; None for `fcfs`, which leaves the queue alone."""
    return None if config.schedule == "fcfs" else AdmissionOrder(strategy, tokens, config)


class AdmissionOrder:
    """Reads the strategy (pure queries) and the token store; mutates only the queue it is given."""

    def __init__(self, strategy: Strategy, tokens: TokenStore, config: SchedulerConfig) -> None:
        self.strategy = strategy
        self.tokens = tokens
        self.schedule = config.schedule
        self.in_batch_prefix_tokens = config.in_batch_prefix_tokens
        self.random_base = mix64(np.array([config.seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ _RANDOM_SALT)

    def arrange(self, waiting: deque[Group], step: int) -> None:
        """Mutates `waiting`: its groups in this order, for the admission pass of step `step`."""
        if len(waiting) < 2 or (self.schedule == "lpm" and len(waiting) > LPM_MAX_WAITING):
            return
        groups = sorted(waiting, key=lambda g: g.index)  # arrival order: every tie below falls back on it
        if self.schedule == "lof":
            order = sorted(range(len(groups)), key=lambda i: -groups[i].request.output_tokens)
        elif self.schedule == "random":
            draws = mix64(mix64(self.random_base + np.uint64(step))
                          + np.array([g.index for g in groups], dtype=np.uint64))
            order = np.argsort(draws, kind="stable").tolist()
        else:
            prompts = [self.tokens.held_in_common(g.request, g.seq_ids, g.generated) for g in groups]
            matches = [self.strategy.prefix_match(ids) for ids in prompts]
            if self.schedule == "lpm":
                deferred = in_batch_deferred(prompts, [m.tokens for m in matches], self.in_batch_prefix_tokens)
                order = sorted(range(len(groups)), key=lambda i: (deferred[i], -matches[i].tokens))
            else:
                order = dfs_weight_order([m.path for m in matches])
        waiting.clear()
        waiting.extend(groups[i] for i in order)


def in_batch_deferred(prompts: list[np.ndarray], cached_tokens: list[int], threshold: int) -> list[bool]:
    """Pure. SGLang's in-batch prefix check over waiting prompts in arrival order (int32 arrays) with their cached
    tokens: a prompt with at most `threshold` tokens cached is deferred when a prompt before it that was checked
    and not deferred shares its first `threshold` tokens; else its prefix joins those checked. 0: none deferred."""
    deferred = [False] * len(prompts)
    if threshold <= 0:
        return deferred
    seen: set[bytes] = set()
    for i, (ids, cached) in enumerate(zip(prompts, cached_tokens, strict=True)):
        if cached > threshold or ids.shape[0] < threshold:
            continue  # cached enough to skip the check, or too short to share `threshold` tokens with anyone
        head = ids[:threshold].tobytes()
        deferred[i] = head in seen
        seen.add(head)
    return deferred


def dfs_weight_order(paths: list[tuple[tuple[int, int], ...]]) -> list[int]:
    """Pure. The positions of `paths` (each group's `PrefixMatch.path`, in arrival order) in dfs-weight order
    (module docstring), walked without recursion: a tree may be deeper than Python's stack."""
    children: dict[int, set[int]] = {}  # node id (or _ROOT) -> its children on some path
    ends: dict[int, list[tuple[int, int]]] = {}  # node id -> (-blocks matched in it, position) of paths ending there
    weight: Counter[int] = Counter()  # node id -> paths through it: the waiting groups in its subtree
    for position, path in enumerate(paths):
        parent = _ROOT
        for node, _ in path:
            children.setdefault(parent, set()).add(node)
            weight[node] += 1
            parent = node
        ends.setdefault(parent, []).append((-path[-1][1] if path else 0, position))
    order: list[int] = []
    stack = [(_ROOT, False)]
    while stack:
        node, subtrees_done = stack.pop()
        if subtrees_done:
            order.extend(position for _, position in sorted(ends.get(node, ())))
            continue
        stack.append((node, True))
        visit = sorted(children.get(node, ()), key=lambda child: (-weight[child], child))
        stack.extend((child, False) for child in reversed(visit))
    return order
