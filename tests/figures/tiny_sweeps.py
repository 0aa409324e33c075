"""The tiny real sweep each figure is built from in the tests (tests/figures/test_figures.py), and the
executor that runs its points in this process."""

from __future__ import annotations

TINY = {"model": "custom:layers=2,kv_heads=2,heads=4,head_dim=64,max_model_len=512", "kv_slots": 3072,
        "kernel": "none", "num_requests": 60, "rate": 20.0, "workload": "sharegpt-like"}
CONTIGUOUS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle"]
# the small hybrid and its attention-only counterpart (its 24 layers all attention, the same parameters); a
# state is 100 blocks of 16 (18.6 MiB), so 0.05 GiB holds 2 checkpoints and the 0.25 GiB pool 13
HYBRID = "qwen3.5-0.8b"
ATTENTION_ONLY = "custom:layers=24,heads=8,kv_heads=2,head_dim=256,params_b=0.752,hidden=1024,vocab=248320"
POLICIES = ("align", "all", "tree", "marconi")
CHECKPOINTED = [(policy, gib) for policy in POLICIES for gib in (0.05, None)]

SPECS = {
    # 4 KiB physical pages hold 16 tokens of the tiny model's 256-byte fp16 rows
    "memory_waste": {"base": TINY, "zip": [{"strategy": [*CONTIGUOUS, "virtual-contiguous", "paged"],
                                            "page_kib": [2048, 2048, 2048, 4, 2048]}]},
    "throughput_vs_rate": {"base": {**TINY, "rate": None},
                           "axes": {"strategy": ["contiguous-max", "paged"], "rate": [2.0, 40.0]}},
    "sharing": {"base": {**TINY, "workload": "alpaca-like"},
                "zip": [{"strategy": ["paged"] * 4 + ["paged-prefix"] * 2,
                         "n": [2, 4, 1, 1, 1, 1], "beam_width": [1, 1, 2, 4, 1, 1],
                         "workload": ["alpaca-like"] * 4 + ["system-prompt:k=2,system=128"] * 2,
                         "kv_slots": [3072] * 4 + [1024, 4096]}]},
    "fragmentation_timeline": {"base": TINY, "axes": {"strategy": ["contiguous-max", "paged"]}},
    "prefix_policies": {"base": TINY,
                        "axes": {"workload": ["system-prompt:k=2,system=128", "system-prompt:k=4,system=256"],
                                 "strategy": ["paged-prefix", "radix"], "kv_slots": [1024, 4096]},
                        # 2^-12 GiB = 16 blocks of the tiny model (1 KiB per token, block 16)
                        "zip": [{"eviction": ["lru", "depth", "lru"], "host_cache_gib": [0.0, 0.0, 2**-12]}]},
    "block_size": {"base": {**TINY, "kernel_every": 2, "kernel_heads": 1},
                   "axes": {"workload": ["sharegpt-like", "alpaca-like"]},
                   "zip": [{"strategy": ["paged", "paged", "virtual-contiguous", "virtual-contiguous"],
                            "block_size": [2, 64, 16, 16], "page_kib": [2048, 2048, 4, 8]},
                           {"clock": ["roofline", "measured"], "kernel": ["none", "numba"], "num_requests": [60, 16]}]},
    "kernel_overhead": {"base": {**TINY, "kernel": "numba", "kernel_every": 2, "num_requests": 8, "rate": 1000.0,
                                 "clock": "measured"},
                        "zip": [{"strategy": ["contiguous-oracle"] * 2 + ["paged"] * 3 + ["virtual-contiguous"] * 2,
                                 "block_size": [16, 16, 16, 16, 4, 16, 16],
                                 "page_kib": [2048] * 5 + [4, 4],
                                 "workload": ["fixed:prompt=64,output=16", "fixed:prompt=256,output=16"] * 2
                                 + ["fixed:prompt=256,output=16"]
                                 + ["fixed:prompt=64,output=16", "fixed:prompt=256,output=16"]}]},
    "chunked_prefill": {"base": {**TINY, "strategy": "paged", "max_num_seqs": 32},
                        "zip": [{"chunked_prefill": [False, True], "max_num_batched_tokens": [None, 64]}]},
    "fleet": {"base": {**TINY, "strategy": "paged-prefix", "workload": "system-prompt:k=4,system=128",
                       "rate": 80.0},
              "zip": [{"replicas": [2, 2, 3, 3, 2, 3],
                       "router": ["round-robin", "cache-aware", "round-robin", "cache-aware", "cache-aware",
                                  "cache-aware"],
                       "prefill_replicas": [0, 0, 0, 0, 1, 1], "decode_replicas": [0, 0, 0, 0, 1, 2]}]},
    "hybrid": {"base": {**TINY, "model": "gpt-oss-20b", "max_model_len": 1024, "kv_slots": None,
                        "workload": "fixed:prompt=300,output=300", "num_requests": 12, "rate": 1000.0},
               "axes": {"kv_gib": [0.06, 0.12], "hybrid": ["on", "off"]}},
    "kv_layouts": {"base": {**TINY, "kv_slots": None, "kv_gib": 1.0, "max_model_len": 512, "num_requests": 8,
                            "block_size": 64},
                   "axes": {"model": ["llama-2-13b", "deepseek-v2-lite", "deepseek-v3.2"]}},
    "spec_decode": {"base": {**TINY, "num_requests": 30},
                    "axes": {"strategy": ["paged", "contiguous-oracle"], "rate": [2.0, 40.0], "spec_tokens": [0, 2],
                             "spec_accept": [0.9]}},
    "admission_order": {"base": {**TINY, "kv_slots": 1024, "rate": 200.0, "num_requests": 40},
                        "zip": [{"workload": ["system-prompt:k=8,system=128"]},
                                {"strategy": ["radix"] * 5 + ["paged-prefix"],
                                 "schedule": ["fcfs", "lpm", "dfs-weight", "lof", "random", "fcfs"]}]},
    "recurrent_state": {
        "base": {**{k: v for k, v in TINY.items() if k != "model"}, "kv_slots": None, "kv_gib": 0.25,
                 "max_model_len": 1024, "num_requests": 30},
        "axes": {"workload": ["system-prompt:k=2,system=256", "multi-turn:turns=3,think=0.5"]},
        # paged-prefix without checkpoints, at each policy and budget, and the attention-only model; radix at each
        # policy with the pool's bound
        "zip": [{"strategy": ["paged-prefix"] * (len(CHECKPOINTED) + 2) + ["radix"] * len(POLICIES),
                 "model": [HYBRID] * (len(CHECKPOINTED) + 1) + [ATTENTION_ONLY] + [HYBRID] * len(POLICIES),
                 "state_checkpoints": ["none", *[p for p, _ in CHECKPOINTED], "none", *POLICIES],
                 "state_cache_gib": [None, *[g for _, g in CHECKPOINTED], None, *[None] * len(POLICIES)]}]},
}


class InProcessExecutor:
    """Runs a sweep's points one after another in this process. The figures are what is tested here, not
    the process pool (tests/sweep covers it): a pool per figure would start and import the package in
    two fresh processes for each of the figures."""

    threads_per_task = 1  # as LocalExecutor(2) gives each point on a 2-core machine

    def map_unordered(self, fn, tasks):
        import numba  # imported first, so a point caps the thread count of this process, not its environment

        before = numba.get_num_threads()
        try:
            for task in tasks:
                yield fn(task)
        finally:
            numba.set_num_threads(before)
