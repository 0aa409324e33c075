"""The public kernel surface: defaults, dispatch, helpers, and one clear ValueError per bad input."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import make_case

from workbench import kernels
from workbench.kernels import reference as ref


def _paged_args():
    case = make_case(np.random.default_rng(0), [5, 9], 4, 2, 16, 4, "fp32")
    return dict(q=case.q, k_pool=case.paged_k, v_pool=case.paged_v, kv_indptr=case.kv_indptr,
                kv_indices=case.kv_indices, kv_last_page_len=case.kv_last_page_len, block_size=4)


def _contig_args():
    case = make_case(np.random.default_rng(0), [5, 9], 4, 2, 16, 4, "fp32")
    return dict(q=case.q, k_pool=case.contig_k, v_pool=case.contig_v, kv_start=case.kv_start, kv_len=case.kv_len)


PAGED_BAD = [
    ("q", lambda a: a["q"].astype(np.float64), "q must be float32"),
    ("q", lambda a: a["q"][:, :3].copy(), "num_heads=3 must be a positive multiple"),
    ("q", lambda a: a["q"][..., :8].copy(), r"q must have shape \[\*, \*, 16\]"),
    ("q", lambda a: np.asfortranarray(a["q"]), "q must be C-contiguous"),
    ("q", lambda a: a["q"].tolist(), "q must be an array"),
    ("v_pool", lambda a: a["v_pool"][:-4], "v_pool must have shape"),
    ("v_pool", lambda a: a["v_pool"].astype(np.float16), "v_pool must be float32"),
    ("k_pool", lambda a: a["k_pool"].view(np.int32), "k_pool dtype must be float32, float16, uint16 .bf16 bits."),
    ("kv_indptr", lambda a: a["kv_indptr"].astype(np.int64), "kv_indptr must be int32"),
    ("kv_indptr", lambda a: a["kv_indptr"][:-1].copy(), r"kv_indptr must have shape \[3\]"),
    ("kv_indptr", lambda a: np.array([0, 2, 2], np.int32), "every sequence >= 1 block"),
    ("kv_indptr", lambda a: np.array([1, 2, 5], np.int32), "must start at 0"),
    ("kv_indices", lambda a: a["kv_indices"] + 100, "kv_indices must lie in 0.."),
    ("kv_indices", lambda a: a["kv_indices"] - 100, "kv_indices must lie in 0.."),
    ("kv_last_page_len", lambda a: a["kv_last_page_len"] * 0, "kv_last_page_len must lie in 1..4"),
    ("kv_last_page_len", lambda a: a["kv_last_page_len"] + 4, "kv_last_page_len must lie in 1..4"),
    ("block_size", lambda a: 0, "block_size must be an int in 1..256"),
    ("block_size", lambda a: 512, "block_size must be an int in 1..256"),
    ("block_size", lambda a: 4.0, "block_size must be an int"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), PAGED_BAD)
def test_paged_decode_rejects(name, mutate, message):
    args = _paged_args()
    args[name] = mutate(args)
    with pytest.raises(ValueError, match=f"paged_decode: .*{message}"):
        kernels.paged_decode(**args)


@pytest.mark.parametrize(
    ("name", "mutate", "message"),
    [
        ("kv_start", lambda a: a["kv_start"].astype(np.int64), "kv_start must be int32"),
        ("kv_len", lambda a: a["kv_len"][:1].copy(), r"kv_len must have shape \[2\]"),
        ("kv_len", lambda a: a["kv_len"] * 0, "kv_len >= 1"),
        ("kv_len", lambda a: a["kv_len"] + 1000, "lie in the pool"),
        ("kv_start", lambda a: a["kv_start"] - 100, "lie in the pool"),
    ],
)
def test_contiguous_decode_rejects(name, mutate, message):
    args = _contig_args()
    args[name] = mutate(args)
    with pytest.raises(ValueError, match=f"contiguous_decode: .*{message}"):
        kernels.contiguous_decode(**args)


def test_kv_dtype_rules():
    args = _paged_args()
    bits = args["k_pool"].view(np.uint16)[..., ::2].copy()
    with pytest.raises(ValueError, match="uint16 pools hold bf16 bits: pass kv_dtype='bf16'"):
        kernels.paged_decode(**{**args, "k_pool": bits, "v_pool": bits})
    with pytest.raises(ValueError, match="kv_dtype='fp16' needs float16 pools, got float32"):
        kernels.paged_decode(**args, kv_dtype="fp16")
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        kernels.paged_decode(**args, kv_dtype="int8")
    out = kernels.paged_decode(**{**args, "k_pool": bits, "v_pool": bits}, kv_dtype="bf16")
    assert out.shape == args["q"].shape and out.dtype == np.float32


def test_extend_rejects_bad_qo_indptr():
    args = _paged_args()
    good = np.array([0, 2, 5], np.int32)
    q = np.zeros((5, 4, 16), np.float32)
    kernels.paged_extend(q, good, **{k: a for k, a in args.items() if k != "q"})
    for bad in ([0, 2, 4], [0, 0, 5], [0, 6, 5], [0, 2, 5, 5]):
        with pytest.raises(ValueError, match="paged_extend: qo_indptr must"):
            kernels.paged_extend(q, np.array(bad, np.int32), **{k: a for k, a in args.items() if k != "q"})
    too_many = np.array([0, 6, 8], np.int32)  # 6 new tokens in a 5-token sequence
    with pytest.raises(ValueError, match="1 <= new tokens <= kv_len"):
        kernels.paged_extend(np.zeros((8, 4, 16), np.float32), too_many,
                             **{k: a for k, a in args.items() if k != "q"})


def test_cache_op_rejections():
    pool = np.zeros((8, 2, 4), np.float32)
    new = np.ones((2, 2, 4), np.float32)
    cases = [
        (lambda: kernels.cache_write(pool, pool, new, new, np.array([1, 2], np.int32)), "slot_mapping must be int64"),
        (lambda: kernels.cache_write(pool, pool, new, new, np.array([1, 8])), "slot_mapping must be < num_slots=8"),
        (lambda: kernels.cache_write(pool, pool, new, new, np.array([3, 3])), "writes one slot twice"),
        (lambda: kernels.cache_write(pool, pool, new.astype(np.float16), new, np.array([0, 1])), "k_new must be"),
        (lambda: kernels.cache_write(pool, pool, new[:, :1].copy(), new, np.array([0, 1])), "k_new must have shape"),
        (lambda: kernels.block_copy(pool, pool, np.array([[0, 1]], np.int64), 2), "copies must be int32"),
        (lambda: kernels.block_copy(pool, pool, np.array([[0, 4]], np.int32), 2), "destinations in 0..3"),
        (lambda: kernels.block_copy(pool, pool, np.array([[0, 1], [2, 1]], np.int32), 2), "must be distinct"),
        (lambda: kernels.block_copy(pool, pool, np.array([[0, 1], [1, 2]], np.int32), 2), "also be a source"),
        (lambda: kernels.block_swap(pool, pool, pool[:4], pool[:4], np.array([[3, 2]], np.int32), 2),
         "destinations in 0..1"),
        (lambda: kernels.block_swap(pool, pool, pool[:, :1].copy(), pool[:, :1].copy(), np.zeros((0, 2), np.int32),
                                    2), "dst_k must have shape"),
        (lambda: kernels.paged_decode(*_paged_args().values(), backend="tpu"), "backend must be one of"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_rejection_leaves_pools_untouched():
    pool = np.arange(16, dtype=np.float32).reshape(8, 1, 2)
    before = pool.copy()
    with pytest.raises(ValueError):
        kernels.cache_write(pool, pool, np.ones((2, 1, 2), np.float32), np.ones((2, 1, 2), np.float32),
                            np.array([1, 9]))
    np.testing.assert_array_equal(pool, before)


def test_defaults_and_backends():
    args = _paged_args()
    assert "numba" in kernels.available_backends() and "reference" in kernels.available_backends()
    assert kernels.default_backend() in kernels.available_backends()
    out = kernels.paged_decode(**args)
    expected = kernels.paged_decode(**args, backend="reference")
    assert expected.dtype == np.float64
    assert ref.rel_err(out, expected) <= 1e-5
    scaled = kernels.paged_decode(**args, scale=0.5 / np.sqrt(16), backend="reference")
    assert ref.rel_err(out, scaled) > 1e-3  # the default scale is 1/sqrt(head_dim), not anything else


def test_kv_len_and_bytes_helpers():
    args = _paged_args()
    assert kernels.paged_kv_len(args["kv_indptr"], args["kv_last_page_len"], 4).tolist() == [5, 9]
    assert kernels.kv_bytes_read(np.array([5, 9]), 2, 16, "fp32") == 2 * 14 * 2 * 16 * 4
    assert kernels.kv_bytes_read(np.array([5, 9]), 2, 16, "bf16") == 2 * 14 * 2 * 16 * 2
