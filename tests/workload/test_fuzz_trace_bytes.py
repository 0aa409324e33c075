"""Hostile trace bytes, fuzzed (hypothesis): a trace is read by its content, never by its name; compressed and
archived files are read or refused in one line; a row whose quoted field spans lines is named by its own first
line; workload parameters at the edge of the floats are refused in one line, never overflow."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.errors import WorkloadError
from workbench.workload import build_workload
from workbench.workload.spec import PARAM_RANGES

TRACE_EXAMPLES = 80
SETTINGS = settings(max_examples=TRACE_EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow on the way is a defect

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_text(lengths: list[tuple[int, int]]) -> str:
    rows = [f"2023-11-16 18:15:{10 + i:02d}.0000000,{p},{o}\n" for i, (p, o) in enumerate(lengths)]
    return AZURE_HEADER + "".join(rows)


def zipped(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("trace.csv", data)
    return buffer.getvalue()


def tarred(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("trace.csv")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# wrapper -> (bytes of the file, None when it is read, else what the refusal names)
WRAPPERS = {
    "plain": (lambda d: d, None), "gzip": (gzip.compress, None), "bzip2": (bz2.compress, None),
    "xz": (lzma.compress, None), "zstd": (lambda d: b"\x28\xb5\x2f\xfd" + d, "zstd-compressed"),
    "zip": (zipped, "a zip archive"), "tar": (tarred, "a tar archive"),
    "gzip-truncated": (lambda d: gzip.compress(d)[:-6], "a complete gzip file"),
}
SUFFIXES = ("", ".csv", ".zip", ".xz", ".tar", ".zst", ".gz", ".bz2", ".tar.gz", ".7z")


@SETTINGS
@given(lengths=st.lists(st.tuples(st.integers(1, 500), st.integers(1, 500)), min_size=1, max_size=6),
       wrapper=st.sampled_from(sorted(WRAPPERS)), suffix=st.sampled_from(SUFFIXES))
def test_a_trace_is_read_by_its_content_whatever_its_name(tmp_path_factory, lengths, wrapper, suffix):
    path = tmp_path_factory.mktemp("trace") / f"trace{suffix}"
    wrap, refusal = WRAPPERS[wrapper]
    path.write_bytes(wrap(azure_text(lengths).encode()))
    event(wrapper)
    if refusal is None:
        requests = build_workload(RunConfig(workload=f"azure:{path}", max_model_len=4096))
        assert [(r.prompt_tokens, r.output_tokens) for r in requests] == lengths
        return
    with pytest.raises(WorkloadError) as info:
        build_workload(RunConfig(workload=f"azure:{path}", max_model_len=4096))
    message = str(info.value)
    assert message.startswith(f"{path}: expected ") and refusal in message and "\n" not in message, message


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
LOG_TYPES = st.one_of(st.just("Conversation log"), st.lists(st.sampled_from(["a", "b, c", 'say ""hi""', ""]),
                                                            min_size=1, max_size=4).map(lambda p: "\n".join(p)))


@SETTINGS
@given(log_types=st.lists(LOG_TYPES, min_size=1, max_size=8), bad=st.data(), crlf=st.booleans())
def test_a_bad_value_after_fields_spanning_lines_names_its_own_line(tmp_path_factory, log_types, bad, crlf):
    bad_row = bad.draw(st.integers(0, len(log_types) - 1))
    rows, line, bad_line = [], 2, None
    for i, log_type in enumerate(log_types):
        request_tokens = "lots" if i == bad_row else "5"
        if i == bad_row:
            bad_line = line
        quoted = '"' + log_type + '"' if ("\n" in log_type or "," in log_type or '"' in log_type) else log_type
        rows.append(f"{i},ChatGPT,{request_tokens},6,11,{quoted}\n")
        line += 1 + log_type.count("\n")
    text = BURST_HEADER + "".join(rows)
    if crlf:
        text = text.replace("\n", "\r\n")
    path = tmp_path_factory.mktemp("quoted") / "trace.csv"
    path.write_bytes(text.encode())
    event("spanning lines" if any("\n" in t for t in log_types) else "one line each")
    with pytest.raises(WorkloadError) as info:
        build_workload(RunConfig(workload=f"burstgpt:{path}"))
    assert (info.value.line, info.value.field) == (bad_line, "Request tokens"), str(info.value)


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e300, 1e-300, 5e-324, -1e-300, 1e308, 0.0, -0.0, 1e3, 1e-3, 1001.0]))
INTEGERS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**63, 10**30]))
WORKLOADS = {  # name -> (its parameter, the strategy of values)
    "sharegpt-like:cv={}": NUMBERS, "alpaca-like:cv={}": NUMBERS, "fixed:cv={}": NUMBERS,
    "multi-turn:think={}": NUMBERS, "multi-turn:cv={}": NUMBERS, "multi-turn:turns={}": INTEGERS,
    "multi-turn:history={}": INTEGERS,
    "fixed:prompt={},output=3": INTEGERS, "fixed:output={}": INTEGERS, "system-prompt:k={},system=8": INTEGERS,
    "system-prompt:system={}": INTEGERS,
}


@SETTINGS
@given(data=st.data(), template=st.sampled_from(sorted(WORKLOADS)))
def test_workload_parameters_at_the_float_edges_are_refused_or_give_finite_requests(data, template):
    value = data.draw(WORKLOADS[template])
    text = template.format(repr(value) if isinstance(value, float) else value)
    try:
        requests = build_workload(RunConfig(workload=text, num_requests=3, max_model_len=4096))
    except WorkloadError as exc:
        event("refused")
        key = template.split(":")[1].split("=")[0]
        assert "\n" not in str(exc) and exc.field in (key, "max_model_len", "system"), str(exc)
        if exc.field == key and isinstance(value, int | float) and not math.isnan(value):
            low, high = PARAM_RANGES[key]
            assert not low <= value <= high or "max_model_len" in str(exc), str(exc)
        return
    event("accepted")
    arrivals = np.array([r.arrival_s for r in requests])
    assert len(requests) == 3 and np.isfinite(arrivals).all() and (np.diff(arrivals) >= 0).all()
    assert all(1 <= r.prompt_tokens < 2**31 and 1 <= r.output_tokens < 2**31 for r in requests)


def test_a_file_named_like_an_archive_that_holds_csv_text_is_read(tmp_path: Path):
    for suffix in (".zip", ".xz", ".tar", ".zst"):
        path = tmp_path / f"trace{suffix}"
        path.write_text(azure_text([(4, 5)]))
        assert [(r.prompt_tokens, r.output_tokens) for r in build_workload(RunConfig(workload=f"azure:{path}"))] == [
            (4, 5)]
