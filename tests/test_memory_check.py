"""The host-memory check counts every array a run allocates up front, for every part that can be large (each
replica's allocator arrays and kernel pools, host tiers, the fleet's one shared tier), against the smaller of
the machine's available memory and the process's address-space limit; a run that does not fit is one line
naming what to lower for its largest part, before any work."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import config as config_module
from workbench.config import GIB, RunConfig, host_memory_parts

SMALL = {"model": "custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512",
         "kv_dtype": "fp32", "workload": "alpaca-like", "num_requests": 4}
# every part of the check at a size where it is the largest
GRID = {
    "allocator arrays": [{"kernel": "none", "kv_slots": 2**31 - 1, "block_size": 1}],
    "K/V pools": [{"kernel": "numba", "kv_slots": 2**24, "replicas": r} for r in (1, 16)],
    "host tiers' K/V": [{"kernel": "numba", "kv_slots": 4096, "strategy": "paged-prefix", "host_cache_gib": 64}],
    "the shared tier's K/V": [{"kernel": "numba", "kv_slots": 4096, "strategy": "paged-prefix", "replicas": 2,
                               "shared_tier_gib": 1024}],
    "requests": [{"kernel": "none", "kv_slots": 4096, "num_requests": 10_000_000}],
}
REMEDY = {"allocator arrays": "--block-size", "K/V pools": "--kernel-heads", "host tiers' K/V": "--host-cache-gib",
          "the shared tier's K/V": "--shared-tier-gib", "requests": "--num-requests"}


@pytest.mark.parametrize(("part", "flags"), [(p, f) for p, fs in GRID.items() for f in fs])
def test_a_run_past_the_memory_it_may_use_is_refused_naming_its_largest_part(monkeypatch, part, flags):
    cfg = RunConfig(**{**SMALL, **flags})
    monkeypatch.setattr(config_module, "available_memory_bytes", lambda: 10**18)
    parts = host_memory_parts(cfg, cfg.resolve())
    largest = max(parts, key=parts.get)
    assert largest.startswith(part), parts
    need = sum(parts.values())
    for room in (need - 1, need // 2, 0):
        monkeypatch.setattr(config_module, "available_memory_bytes", lambda room=room: room)
        with pytest.raises(ValueError) as refused:
            cfg.resolve()
        message = str(refused.value)
        assert "\n" not in message and f"{need / GIB:.3g} GiB of host memory" in message
        assert f"{largest} " in message and "lower " in message and REMEDY[part] in message
    monkeypatch.setattr(config_module, "available_memory_bytes", lambda: need)
    cfg.resolve()


@pytest.mark.parametrize(("replicas", "kernel", "host_gib", "shared_gib"),
                         list(itertools.product((1, 3), ("none", "numba", "cupy"), (0.0, 0.5), (0.0, 0.25))))
def test_every_replica_counts_and_the_shared_tier_counts_once(replicas, kernel, host_gib, shared_gib):
    base = RunConfig(**SMALL, kv_slots=8192, kernel=kernel, strategy="paged-prefix", host_cache_gib=host_gib,
                     shared_tier_gib=shared_gib if replicas > 1 else 0.0)
    one = host_memory_parts(RunConfig(**{**base.to_dict(), "shared_tier_gib": 0.0}), base.resolve())
    fleet = RunConfig(**{**base.to_dict(), "replicas": replicas})
    parts = host_memory_parts(fleet, fleet.resolve())
    for part, size in one.items():
        assert parts[part] == (size if part == "requests" else replicas * size)  # one workload for the fleet
    assert ("the shared tier's K/V" in parts) == (kernel != "none" and shared_gib > 0 and replicas > 1)
    assert ("host tiers' K/V" in parts) == (kernel != "none" and host_gib > 0)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc are Linux's")
def test_the_address_space_limit_bounds_what_a_run_may_use():
    code = ("import resource; from workbench.config import available_memory_bytes as a, GIB, "
            "ADDRESS_SPACE_HEADROOM_BYTES as room; free = a(); "
            "resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, resource.RLIM_INFINITY)); limited = a(); "
            "print(free > 0, 0 <= limited <= 4 * GIB - room, limited <= free)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
