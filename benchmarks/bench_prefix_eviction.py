"""Prefix-cache cost under eviction on the Mooncake conversation trace (docs/performance.md).

Two rows, each one operation stream replayed on a fresh pool after an untimed warm-up (which loads
compiled code) and timed in CPU seconds (`time.process_time`, so other processes do not count):

- `radix` at block size 1 (one tree position per token, SGLang's default page size): prompts are the
  trace's own token content (shared hash blocks give shared prefixes), the pool holds a few running
  requests plus a cache that fills and then evicts.
- the hybrid (per-layer-group) form of `paged-prefix` on gpt-oss-120b's geometry (a 128-token sliding
  window group beside a full-attention group) at block size 16, on a pool small enough to evict.

The stream does not depend on the strategy: requests in trace order, at most `--running` sequences,
one token per running sequence per step, a sequence freed at its final length; the pools are sized so
that nothing is ever refused. Printed per row: operations, prefix hit tokens and evicted blocks (which
must not change when only the speed does) and CPU seconds.

    python benchmarks/bench_prefix_eviction.py [--requests N] [--repeat R] [--rows radix,hybrid]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque

import numpy as np

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec
from workbench.errors import TraceError
from workbench.presets import MODELS
from workbench.traces import resolve
from workbench.workload.mooncake import read_mooncake
from workbench.workload.request import VOCAB_SIZE, content_token_ids
from workbench.workload.spec import WorkloadSpec

TRACE = "mooncake-fast25-conversation"
MAX_OUTPUT_TOKENS = 64  # decode steps per request, capped: the rows measure the cache, not decode


def load_prompts(num_requests: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Token ids (int32 [prompt_tokens] each) and output token counts of the trace's first requests."""
    try:
        path = resolve(TRACE)
    except TraceError as exc:
        sys.exit(f"bench_prefix_eviction: {exc}")
    table = read_mooncake(path, WorkloadSpec(TRACE, "mooncake", path=str(path)))
    n = min(num_requests, len(table.content))
    prompts = [content_token_ids(table.content[i]) for i in range(n)]
    return prompts, np.minimum(np.asarray(table.output_tokens[:n], dtype=np.int64), MAX_OUTPUT_TOKENS)


def build_stream(prompts: list[np.ndarray], outputs: np.ndarray, max_running: int, seed: int = 0) -> list[tuple]:
    """("admit", id, SeqSpec) | ("step", [ids], token ids int32) | ("free", id), in order."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = []
    running: dict[int, int] = {}  # id -> steps left
    waiting = deque(range(len(prompts)))
    while waiting or running:
        while waiting and len(running) < max_running:
            i = waiting.popleft()
            steps = max(int(outputs[i]) - 1, 0)  # the last sampled token's KV is never written
            ops.append(("admit", i, SeqSpec(prompts[i], prompts[i].shape[0] + steps)))
            running[i] = steps
            if steps == 0:
                ops.append(("free", i))
                del running[i]
        if not running:
            continue
        batch = list(running)
        ops.append(("step", batch, rng.integers(0, VOCAB_SIZE, len(batch)).astype(np.int32)))
        for i in batch:
            running[i] -= 1
            if running[i] == 0:
                ops.append(("free", i))
                del running[i]
    return ops


def replay(pool, ops: list[tuple]) -> float:
    """CPU seconds of the pool's work over the stream; every admission must succeed."""
    clock = time.process_time
    t0 = clock()
    for op in ops:
        if op[0] == "step":
            pool.append(op[1], op[2])
        elif op[0] == "admit":
            if not pool.admit([op[1]], op[2]).admitted:
                raise RuntimeError(f"request {op[1]} refused: the pool is too small for a fixed stream")
        else:
            pool.free(op[1])
    return clock() - t0


def radix_pool(max_len: int, running: int):
    capacity = running * max_len  # every running request at its longest fits; the rest is cache
    return registry.create("radix", capacity_slots=capacity, block_size=1, max_model_len=max_len)


def hybrid_pool(max_len: int, running: int):
    groups = tuple((g.window_tokens, g.num_layers // MODELS["gpt-oss-120b"].unit_layers())
                   for g in MODELS["gpt-oss-120b"].groups())
    units = sum(u for _, u in groups)
    capacity = running * (max_len + 16) * units  # every running request at its longest fits in every group
    return registry.create_hybrid("paged-prefix", capacity_slots=capacity, block_size=16, max_model_len=max_len,
                                  groups=groups)


ROWS = {"radix": ("radix", "block 1", 8, radix_pool),
        "hybrid": ("paged-prefix hybrid gpt-oss-120b", "block 16", 16, hybrid_pool)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests taken from the trace start")
    parser.add_argument("--repeat", type=int, default=1, help="replays per row (the minimum is printed)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, of {', '.join(ROWS)}")
    args = parser.parse_args()
    prompts, outputs = load_prompts(args.requests)
    max_len = max(p.shape[0] + int(o) for p, o in zip(prompts, outputs, strict=True))
    print(f"{TRACE}: first {len(prompts)} requests, {sum(p.shape[0] for p in prompts):,} prompt tokens, "
          f"outputs capped at {MAX_OUTPUT_TOKENS}")
    print(f"{'pool':<34} {'blocks':>8} {'ops':>8} {'hit tokens':>12} {'evicted':>10} {'CPU s':>7}")
    for row in args.rows.split(","):
        label, bs, running, make = ROWS[row]
        ops = build_stream(prompts, outputs, running)
        replay(make(max_len, running), ops[:300])  # untimed: loads compiled code
        times = []
        for _ in range(args.repeat):
            pool = make(max_len, running)
            times.append(replay(pool, ops))
        print(f"{label:<34} {bs:>8} {len(ops):>8,} {pool.prefix_hit_tokens:>12,} {pool.prefix_evicted_blocks:>10,} "
              f"{min(times):>7.2f}")


if __name__ == "__main__":
    main()
