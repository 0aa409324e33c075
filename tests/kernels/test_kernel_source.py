"""Finding the CUDA sources in a checkout or an installed wheel, the #line prefix, and compile errors."""

from __future__ import annotations

import pytest

from workbench.kernels import source


@pytest.fixture
def fresh_lookup():
    source.kernels_dir.cache_clear()
    yield
    source.kernels_dir.cache_clear()


def test_read_source_points_compiler_messages_at_the_real_file():
    text = source.read_source(source.ATTENTION_CU)
    first, rest = text.split("\n", 1)
    assert first == f'#line 1 "{source.kernels_dir() / source.ATTENTION_CU}"'
    assert rest == (source.kernels_dir() / source.ATTENTION_CU).read_text()


def test_wheel_layout_is_found_when_there_is_no_checkout(tmp_path, monkeypatch, fresh_lookup):
    package = tmp_path / "site-packages" / "workbench"
    (package / "_kernels").mkdir(parents=True)
    (package / "_kernels" / source.ATTENTION_CU).write_text("// shipped\n")
    monkeypatch.setattr(source, "REPO_ROOT", tmp_path / "site-packages")
    monkeypatch.setattr(source, "PACKAGE_DIR", package)
    assert source.kernels_dir() == package / "_kernels"
    assert source.read_source(source.ATTENTION_CU).endswith("// shipped\n")


def test_missing_sources_name_both_places(tmp_path, monkeypatch, fresh_lookup):
    monkeypatch.setattr(source, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.setattr(source, "PACKAGE_DIR", tmp_path / "pkg")
    with pytest.raises(FileNotFoundError, match=r"repo/kernels.*pkg/_kernels"):
        source.kernels_dir()


def test_digest_covers_every_source_file():
    names = {p.name for p in source.source_files()}
    assert {source.ATTENTION_CU, source.CACHE_OPS_CU, source.SHIM_HEADER, source.SHIM_ENTRY, "kv_common.cuh"} <= names
    assert len(source.sources_digest()) == 64


def test_attention_names_cover_the_template_grid():
    names = source.all_attention_kernel_names()
    assert len(names) == len(set(names)) == 2 * 4 * 5 * 4
    assert source.attention_kernel_name("paged", "bf16", 128, 4) == "kvw::paged_attention<__nv_bfloat16, 128, 4>"
    with pytest.raises(ValueError, match="addressing"):
        source.attention_kernel_name("ragged", "fp16", 64, 1)


def test_nvrtc_errors_carry_the_compiler_log():
    pytest.importorskip("cuda.bindings.nvrtc")
    from workbench.kernels import nvrtc

    with pytest.raises(nvrtc.NvrtcError, match=r"(?s)cache_ops\.cu for sm_80.*no member \"no_such_kernel\""):
        nvrtc.compile_cubin(source.CACHE_OPS_CU, ["kvw::no_such_kernel<int>"], "sm_80")
