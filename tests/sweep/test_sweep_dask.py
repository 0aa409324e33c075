"""The Dask executor (a LocalCluster of worker processes) gives the same summary as the process pool."""

from __future__ import annotations

import pandas as pd
import pytest
from sweep_fake_engine import fake_run

from workbench.columns import WALL_CLOCK_KEYS
from workbench.sweep import DaskExecutor, LocalExecutor, SweepError, parse_spec, run_sweep

pytest.importorskip("dask.distributed")

SPEC = {"name": "dask", "axes": {"strategy": ["paged", "contiguous-oracle"], "seed": [0, 1, 2]},
        "zip": [{"block_size": [8, 32], "rate": [1.0, 4.0]}]}


# tests/sweep/test_sweep_cli.py compares Dask with the process pool on the real engine in `make test`; this
# comparison over more points of the stand-in engine runs in the full suite
@pytest.mark.slow
def test_dask_local_cluster_equals_local_pool(tmp_path):
    spec = parse_spec(SPEC)
    local = run_sweep(spec, tmp_path / "local", executor=LocalExecutor(2), progress=False, run_fn=fake_run)
    dask = run_sweep(spec, tmp_path / "dask", executor=DaskExecutor(workers=2), progress=False, run_fn=fake_run)
    assert list(dask["point_id"]) == [p.point_id for p in spec.points()]
    pd.testing.assert_frame_equal(local.drop(columns=list(WALL_CLOCK_KEYS)), dask.drop(columns=list(WALL_CLOCK_KEYS)))


def test_dask_reports_the_failing_point(tmp_path):
    spec = parse_spec({"axes": {"seed": [666]}})
    with pytest.raises(SweepError, match=r"point 0 .*seed=666.* failed: RuntimeError"):
        run_sweep(spec, tmp_path, executor=DaskExecutor(workers=1), progress=False, run_fn=fake_run)
