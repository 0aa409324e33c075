"""Allocator cost on an operation stream from the Azure LLM conversation trace (docs/performance.md).

The stream: requests in trace order (ContextTokens, GeneratedTokens), continuous batching with at
most 256 running sequences, one token per running sequence per step, a sequence freed when it
reaches its final length. It does not depend on the strategy (the pool is large enough that nothing
is refused), so every strategy and the plain-Python baseline replay the same operations.

Printed: operations per second (an operation = one admission, one sequence's append, or one free),
microseconds of allocator work per step at 256 running sequences (admissions, appends, frees; then
`describe` for the kernel), and the cost per operation at pools of 10k, 100k and 1M blocks, which
must stay flat. Wall times are noisy on a shared machine: compare rows of one run.

    python benchmarks/bench_allocators.py [--requests N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import pandas as pd

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec
from workbench.errors import TraceError
from workbench.traces import resolve

MAX_MODEL_LEN = 16_384  # the trace's longest request is 15,050 tokens


def load_lengths(num_requests: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of the first requests of the Azure conversation trace."""
    try:
        path = resolve("azure-llm-2023-conv")  # cache, shared folder, else a verified download
    except TraceError as exc:
        sys.exit(f"bench_allocators: {exc}")
    df = pd.read_csv(path, usecols=["ContextTokens", "GeneratedTokens"], nrows=num_requests)
    return df["ContextTokens"].to_numpy(np.int64), df["GeneratedTokens"].to_numpy(np.int64)


def build_stream(prompts: np.ndarray, outputs: np.ndarray, max_running: int, seed: int = 0) -> list[tuple]:
    """("admit", id, SeqSpec) | ("step", [ids], token ids int32 [len(ids)]) | ("free", id), in order. A
    sequence holds its prompt after admission and one more token per step until it reaches
    prompt + output - 1 tokens (the last sampled token's KV is never written)."""
    rng = np.random.default_rng(seed)
    ops: list[tuple] = []
    running: dict[int, int] = {}  # id -> steps left
    waiting = deque(range(prompts.shape[0]))
    while waiting or running:
        while waiting and len(running) < max_running:
            i = waiting.popleft()
            final = int(prompts[i] + outputs[i] - 1)
            ops.append(("admit", i, SeqSpec(rng.integers(0, 50_272, prompts[i]).astype(np.int32), final)))
            running[i] = final - int(prompts[i])
            if running[i] == 0:
                ops.append(("free", i))
                del running[i]
        batch = list(running)
        ops.append(("step", batch, rng.integers(0, 50_272, len(batch)).astype(np.int32)))
        for i in batch:
            running[i] -= 1
            if running[i] == 0:
                ops.append(("free", i))
                del running[i]
    return ops


def num_operations(ops: list[tuple]) -> int:
    return sum(len(op[1]) if op[0] == "step" else 1 for op in ops)


class NanoBlockManager:
    """A plain-Python block manager of the nano-vllm kind: deque of free ids, list refcounts, one
    Python list per block table, one decision per sequence per step. The baseline of docs/performance.md."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.block_tables: dict[int, list[int]] = {}
        self.num_tokens: dict[int, int] = {}

    def _allocate_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        self.ref_count[block_id] = 1
        self.used_block_ids.add(block_id)
        return block_id

    def can_allocate(self, num_tokens: int) -> bool:
        return len(self.free_block_ids) >= -(-num_tokens // self.block_size)

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        self.block_tables[seq_id] = [self._allocate_block() for _ in range(-(-num_tokens // self.block_size))]
        self.num_tokens[seq_id] = num_tokens

    def deallocate(self, seq_id: int) -> None:
        for block_id in reversed(self.block_tables.pop(seq_id)):
            self.ref_count[block_id] -= 1
            if self.ref_count[block_id] == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        del self.num_tokens[seq_id]

    def can_append(self, seq_ids: list[int]) -> bool:
        needed = sum(1 for s in seq_ids if self.num_tokens[s] % self.block_size == 0)
        return len(self.free_block_ids) >= needed

    def may_append(self, seq_id: int) -> int:
        table, n = self.block_tables[seq_id], self.num_tokens[seq_id]
        if n % self.block_size == 0:
            table.append(self._allocate_block())
        self.num_tokens[seq_id] = n + 1
        return table[-1] * self.block_size + n % self.block_size

    def describe(self, seq_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        indptr, indices, last_page_len = [0], [], []
        for s in seq_ids:
            indices.extend(self.block_tables[s])
            indptr.append(len(indices))
            last_page_len.append(self.num_tokens[s] - (len(self.block_tables[s]) - 1) * self.block_size)
        return (np.array(indptr, dtype=np.int32), np.array(indices, dtype=np.int32),
                np.array(last_page_len, dtype=np.int32))


class NanoAdapter:
    """The baseline behind the verbs the replay uses."""

    wants_token_ids = False

    def __init__(self, capacity_slots: int, block_size: int) -> None:
        self.m = NanoBlockManager(capacity_slots // block_size, block_size)

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> None:
        assert self.m.can_allocate(spec.num_tokens)
        self.m.allocate(seq_ids[0], spec.num_tokens)

    def append(self, seq_ids: list[int]) -> np.ndarray:
        assert self.m.can_append(seq_ids)
        return np.array([self.m.may_append(s) for s in seq_ids], dtype=np.int64)

    def free(self, seq_id: int) -> None:
        self.m.deallocate(seq_id)

    def describe(self, seq_ids: list[int]):
        return self.m.describe(seq_ids)


def replay(make: Callable[[], object], ops: list[tuple], with_describe: bool, full_batch: int):
    """Run the stream once on a fresh instance, after a short untimed warm-up run on another (which
    loads compiled code). Returns (total seconds, per-step seconds of steps whose batch is
    `full_batch` sequences: work of that step including its admissions and frees)."""
    warm = make()
    for op in ops[:2000]:
        if op[0] == "step":
            if warm.wants_token_ids:
                warm.append(op[1], op[2])
            else:
                warm.append(op[1])
            warm.describe(op[1])
        elif op[0] == "admit":
            warm.admit([op[1]], op[2])
        else:
            warm.free(op[1])
    s = make()
    wants_token_ids = s.wants_token_ids  # paged-prefix registers decode-filled blocks, as in the engine
    total = 0.0
    step_times = []
    pending = 0.0  # admissions and frees since the last step belong to the next step's work
    clock = time.perf_counter
    for op in ops:
        kind = op[0]
        t0 = clock()
        if kind == "step":
            if wants_token_ids:
                s.append(op[1], op[2])
            else:
                s.append(op[1])
            if with_describe:
                s.describe(op[1])
        elif kind == "admit":
            s.admit([op[1]], op[2])
        else:
            s.free(op[1])
        dt = clock() - t0
        total += dt
        if kind == "step":
            if len(op[1]) == full_batch:
                step_times.append(pending + dt)
            pending = 0.0
        else:
            pending += dt
    return total, np.array(step_times)


def strategy_factory(name: str, capacity_slots: int, block_size: int, fit: str = "-"):
    if name == "nano-vllm-style":
        return lambda: NanoAdapter(capacity_slots, block_size)
    options = {} if fit == "-" else {"fit": fit}
    return lambda: registry.create(name, capacity_slots=capacity_slots, block_size=block_size,
                                   max_model_len=MAX_MODEL_LEN, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests taken from the trace start")
    args = parser.parse_args()
    prompts, outputs = load_lengths(args.requests)
    ops = build_stream(prompts, outputs, max_running=256)
    n_ops = num_operations(ops)
    capacity = 256 * MAX_MODEL_LEN  # nothing is ever refused, even reserving max_model_len
    print(f"stream: {args.requests} Azure conversation requests, {n_ops:,} operations, "
          f"{sum(op[0] == 'step' for op in ops):,} steps, at most 256 running\n")
    rows = [("nano-vllm-style", 16, "-"), ("paged", 16, "-"), ("paged-prefix", 16, "-"), ("radix", 16, "-"),
            ("nano-vllm-style", 1, "-"),
            ("paged", 1, "-"), ("contiguous-max", 1, "first"), ("contiguous-pow2", 1, "best"),
            ("contiguous-oracle", 1, "first"), ("contiguous-oracle", 1, "buddy")]
    print(f"{'strategy':<18} {'bs':>3} {'fit':>5} {'Mops/s':>7} {'us/step@256':>12} {'+describe':>10}")
    for name, bs, fit in rows:
        make = strategy_factory(name, capacity, bs, fit)
        total, steps = replay(make, ops, with_describe=False, full_batch=256)
        _, steps_d = replay(make, ops, with_describe=True, full_batch=256)
        print(f"{name:<18} {bs:>3} {fit:>5} {n_ops / total / 1e6:>7.2f} {np.median(steps) * 1e6:>12.1f} "
              f"{np.median(steps_d) * 1e6:>10.1f}")

    small = build_stream(np.minimum(prompts, 3072), outputs, max_running=32)
    n_small = num_operations(small)
    print(f"\ncost per operation vs pool size (pools of N blocks of 16 slots; contiguous strategies get the same "
          f"slots; at most 32 running, {n_small:,} operations)")
    print(f"{'strategy':<18} {'10k blocks':>11} {'100k blocks':>12} {'1M blocks':>10}   (ns/op)")
    for name, bs, fit in (("nano-vllm-style", 16, "-"), ("paged", 16, "-"), ("paged-prefix", 16, "-"),
                          ("radix", 16, "-"), ("contiguous-oracle", 1, "first")):
        cells = []
        for num_blocks in (10_000, 100_000, 1_000_000):
            make = strategy_factory(name, num_blocks * 16, bs, fit)
            total, _ = replay(make, small, with_describe=True, full_batch=32)
            cells.append(total / n_small * 1e9)
        print(f"{name:<18} {cells[0]:>11.0f} {cells[1]:>12.0f} {cells[2]:>10.0f}")


if __name__ == "__main__":
    main()
