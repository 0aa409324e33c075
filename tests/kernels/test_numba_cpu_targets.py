"""The Numba kernels under other CPU targets (NUMBA_CPU_NAME, as on a mixed cluster of Dask workers): right
results, never a signal. `generic` gets no CPU features at all, so fp16 must take the portable conversion
(an `fpext half` there would be a call to a soft-float helper the JIT cannot resolve)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, numba_env_for_target

# Decode (paged, split into several partitions) and extend (contiguous) for every KV dtype against the
# float64 reference; prints whether this target converts fp16 in hardware.
_PROGRAM = """
import sys
sys.path.insert(0, "tests/kernels")
import numpy as np
from kernel_cases import KV_DTYPES, assert_attention_close, make_case, random_qo_indptr
from workbench import kernels
from workbench.kernels import reference as ref
from workbench.kernels.numba_convert import TARGET_HAS_F16C
rng = np.random.default_rng(7)
for kv_dtype in KV_DTYPES:
    case = make_case(rng, [1, 17, 1500], 8, 2, 32, 16, kv_dtype)
    scale = 1 / np.sqrt(case.q.shape[2])
    out = kernels.paged_decode(case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                               case.kv_last_page_len, case.block_size, kv_dtype=kv_dtype)
    want = ref.paged_decode(case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                            case.kv_last_page_len, case.block_size, kv_dtype, scale)
    assert_attention_close(out, want, kv_dtype, np.arange(len(case.q) + 1))
    qo_indptr = random_qo_indptr(rng, case.kv_len)
    case = make_case(rng, case.kv_len, 8, 2, 32, 16, kv_dtype, num_q=int(qo_indptr[-1]))
    out = kernels.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                    kv_dtype=kv_dtype)
    want = ref.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                 kv_dtype, scale)
    assert_attention_close(out, want, kv_dtype, qo_indptr)
print("f16c" if TARGET_HAS_F16C else "portable")
"""


# generic in every run (no CPU features: the portable fp16 route); x86-64 in the full run (the golden engine
# cases run under it in every run)
@pytest.mark.parametrize(("cpu_name", "route"), [("generic", "portable"),
                                                 pytest.param("x86-64", None, marks=pytest.mark.slow)])
def test_kernels_are_right_under_another_cpu_target(cpu_name, route, tmp_path):
    done = subprocess.run([sys.executable, "-c", _PROGRAM], cwd=REPO, env=numba_env_for_target(cpu_name, tmp_path),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"exit {done.returncode} under NUMBA_CPU_NAME={cpu_name}: {done.stderr[-3000:]}"
    if route is not None:
        assert done.stdout.split()[-1] == route
