"""The trace registry and its verified fetch, served from a loopback HTTP server (never the network)."""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import subprocess

import pytest

from tests.conftest import shared_folder_of
from tests.traces.conftest import git_blob_id
from workbench.config import RunConfig
from workbench.errors import TraceError, WorkloadError
from workbench.paths import shared_traces_dir
from workbench.traces import TRACES, TraceEntry, fetch, resolve
from workbench.traces import registry as registry_module
from workbench.traces.__main__ import main
from workbench.traces.derive import DERIVATIONS, pickle_lengths_csv
from workbench.traces.registry import UNKNOWN_SIZE_CAP_BYTES
from workbench.traces.store import git_blob_sha1_of
from workbench.workload import build_workload

TINY = b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n"


@pytest.fixture
def tiny(monkeypatch, server):
    www, base = server
    (www / "tiny.csv").write_bytes(TINY)
    entry = TraceEntry("tiny", "tiny", "tiny.csv", "burstgpt", hashlib.sha256(TINY).hexdigest(), len(TINY), 1,
                       "CC-BY-4.0", f"{base}/tiny.csv", "test bytes")
    monkeypatch.setitem(registry_module.TRACES, "tiny", entry)
    return entry


def _files(path):
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) if path.exists() else []


def test_fetch_verifies_and_caches(cache, tiny):
    path = fetch("tiny")
    assert path == cache / "tiny" / "tiny.csv" and path.read_bytes() == TINY
    assert _files(cache) == ["tiny", "tiny/tiny.csv"]
    assert resolve("tiny") == path


def test_checksum_mismatch_is_refused_and_leaves_nothing(cache, tiny, server):
    www, base = server
    (www / "tampered.csv").write_bytes(TINY.replace(b"472", b"473"))
    with pytest.raises(TraceError, match="checksum mismatch.*expected sha256 " + tiny.sha256):
        fetch("tiny", url=f"{base}/tampered.csv")
    assert _files(cache) == []


def test_a_download_larger_than_the_registry_says_is_refused(cache, tiny, server):
    www, base = server
    (www / "big.csv").write_bytes(TINY + b"7,ChatGPT,1,1,2,Conversation log\n")
    with pytest.raises(TraceError, match=f"more than the registry's {len(TINY)}"):
        fetch("tiny", url=f"{base}/big.csv")
    assert _files(cache) == []


def test_missing_file_on_the_server_leaves_nothing(cache, tiny, server):
    with pytest.raises(TraceError, match="cannot download"):
        fetch("tiny", url=f"{server[1]}/absent.csv")
    assert _files(cache) == []


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_file_url_that_is_no_regular_file_is_refused_without_waiting(cache, tiny, tmp_path, kind):
    from tests.test_reads_never_wait import make, watchdog

    published = make(kind, tmp_path / "published.csv")  # a FIFO nobody writes would block a plain open
    with watchdog(), pytest.raises(TraceError, match="not a regular file|Is a directory"):
        fetch("tiny", url=published.as_uri())
    assert _files(cache) == []


def test_a_corrupted_cache_copy_is_replaced(cache, tiny):
    (cache / "tiny").mkdir(parents=True)
    (cache / "tiny" / "tiny.csv").write_bytes(b"garbage")
    assert resolve("tiny").read_bytes() == TINY


def test_a_derivation_that_gives_other_bytes_is_refused(cache, server, monkeypatch):
    www, base = server
    published = pickle.dumps([(3, 4), (5, 6)])
    (www / "pairs.pkl").write_bytes(published)
    derived = pickle_lengths_csv(published)
    entry = TraceEntry("pairs", "pairs", "pairs.csv", "lengths", hashlib.sha256(derived + b"x").hexdigest(),
                       len(derived), 2, "test", f"{base}/pairs.pkl", "test bytes", derive="pickle-lengths-csv",
                       upstream_sha256=hashlib.sha256(published).hexdigest(), upstream_size_bytes=len(published))
    monkeypatch.setitem(registry_module.TRACES, "pairs", entry)
    with pytest.raises(TraceError, match="deriving it .pickle-lengths-csv. .* expected"):
        fetch("pairs")
    assert _files(cache) == []
    monkeypatch.setitem(registry_module.TRACES, "pairs",
                        dataclasses.replace(entry, sha256=hashlib.sha256(derived).hexdigest()))
    assert fetch("pairs").read_bytes() == b"input_tokens,output_tokens\r\n3,4\r\n5,6\r\n"


def test_a_pickle_that_names_a_global_is_refused_without_running_it():
    with pytest.raises(TraceError, match="refers to builtins.print"):
        pickle_lengths_csv(pickle.dumps([(1, 2), print]))
    with pytest.raises(TraceError, match="integer pairs"):
        pickle_lengths_csv(pickle.dumps([(1, 2.5)]))


def test_every_entry_has_a_published_source_and_known_derivation():
    for entry in TRACES.values():
        assert entry.url.startswith("https://raw.githubusercontent.com/"), entry.name
        assert entry.licence and entry.rows > 0
        if entry.git_blob_sha1 is not None:  # pinned by the upstream tree's blob id: size and sha256 unknown
            assert len(entry.git_blob_sha1) == 40 and entry.sha256 is None and entry.derive is None
            assert entry.size_bytes is None
            assert entry.download_size_bytes == (entry.size_cap_bytes or UNKNOWN_SIZE_CAP_BYTES)
            continue
        assert entry.size_bytes > 0 and len(entry.sha256) == 64
        if entry.derive is None:
            assert entry.upstream_sha256 is None and entry.download_sha256 == entry.sha256
        else:
            assert entry.derive in DERIVATIONS and len(entry.upstream_sha256) == 64 and entry.upstream_size_bytes


def test_unknown_name():
    with pytest.raises(TraceError, match="unknown trace"):
        fetch("no-such-trace")


def test_workload_spec_resolves_a_registry_name_by_fetching(cache, tiny):
    requests = build_workload(RunConfig(workload="burstgpt:tiny"))
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(472, 18)]
    assert _files(cache) == ["tiny", "tiny/tiny.csv"]


def test_a_failed_fetch_reaches_the_user_whole(cache, tiny, server, monkeypatch):
    long_url = f"{server[1]}/{'x' * 200}/absent.csv"
    monkeypatch.setitem(registry_module.TRACES, "tiny", dataclasses.replace(tiny, url=long_url))
    with pytest.raises(WorkloadError, match="nothing was written") as info:
        build_workload(RunConfig(workload="burstgpt:tiny"))
    assert long_url in str(info.value)


def test_cli_fetch_and_list(cache, tiny, server, capsys):
    www, base = server
    (www / "tampered.csv").write_bytes(b"x")
    assert main(["fetch", "tiny", "--url", f"{base}/tampered.csv"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: checksum mismatch for trace 'tiny'")
    assert _files(cache) == []
    assert main(["fetch", "tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "tiny" / "tiny.csv")
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in TRACES)
    assert "nowhere" not in listing
    tiny_line = next(line for line in listing.splitlines() if line.startswith("tiny "))
    assert " cache " in tiny_line and "CC-BY-4.0" in tiny_line


def test_resolve_prefers_cache_then_shared(tmp_path, monkeypatch, tiny):
    shared = tmp_path / "shared"
    (shared / "tiny").mkdir(parents=True)
    (shared / "tiny" / "tiny.csv").write_bytes(TINY)
    monkeypatch.setenv("WORKBENCH_TRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("workbench.traces.store.shared_traces_dir", lambda: shared)
    assert resolve("tiny") == shared / "tiny" / "tiny.csv"
    fetched = fetch("tiny")
    assert resolve("tiny") == fetched != shared / "tiny" / "tiny.csv"


def test_shared_folder_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SHARED_TRACES", str(tmp_path))
    assert shared_traces_dir() == tmp_path


@pytest.mark.parametrize("name", sorted(TRACES))
def test_registry_matches_the_shared_files(name):
    folder = shared_folder_of(name, "compares the registry with")
    entry = TRACES[name]
    path = folder / entry.folder / entry.file_name
    data = path.read_bytes()
    if entry.git_blob_sha1 is not None:
        assert git_blob_id(data) == entry.git_blob_sha1
    else:
        assert len(data) == entry.size_bytes
        assert hashlib.sha256(data).hexdigest() == entry.sha256
    if entry.file_name.endswith(".json"):
        assert data.count(b'"instruction"') == entry.rows
    else:
        header = 0 if entry.file_name.endswith(".jsonl") else 1
        assert len(data.decode().splitlines()) - header == entry.rows
    readme = (folder / entry.folder / "README.md").read_text()
    assert (entry.sha256 or entry.git_blob_sha1) in readme
    commit = entry.url.split("/")[5]  # https://raw.githubusercontent.com/OWNER/REPO/COMMIT/PATH
    assert commit in readme, f"{name}: the README does not name commit {commit}"


def test_an_unusable_cache_is_one_line_from_the_run_cli(tmp_path, monkeypatch, tiny, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WORKBENCH_TRACE_CACHE", str(blocker / "cache"))
    monkeypatch.setattr("workbench.traces.store.shared_traces_dir", lambda: None)
    with pytest.raises(TraceError, match=rf"the trace cache {blocker / 'cache'} is unusable \(Not a directory"):
        fetch("tiny")
    from workbench.run import main as run_main

    assert run_main(["--workload", "burstgpt:tiny", "--kernel", "none", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is unusable (Not a directory" in err
    assert "set $WORKBENCH_TRACE_CACHE to a writable folder)" in err
    assert not (tmp_path / "out").exists() and blocker.read_text() == "not a folder"


@pytest.fixture
def blob_pinned(monkeypatch, server):
    """A registry entry pinned by git blob id only (size and sha256 unknown), served from loopback."""
    www, base = server
    (www / "pinned.csv").write_bytes(TINY)
    blob_id = subprocess.run(["git", "hash-object", "--stdin"], input=TINY, capture_output=True, check=True)
    entry = TraceEntry("pinned", "pinned", "pinned.csv", "burstgpt", None, None, 1, "CC-BY-4.0",
                       f"{base}/pinned.csv", "test bytes", git_blob_sha1=blob_id.stdout.decode().strip())
    monkeypatch.setitem(registry_module.TRACES, "pinned", entry)
    return entry


def test_git_blob_ids_are_what_git_prints(tmp_path):
    for data in (b"", b"hello\n", TINY, bytes(range(256)) * 5000):
        path = tmp_path / "f"
        path.write_bytes(data)
        expected = subprocess.run(["git", "hash-object", str(path)], capture_output=True, check=True)
        assert git_blob_sha1_of(path) == expected.stdout.decode().strip()


def test_a_blob_pinned_trace_is_fetched_verified_and_reused(cache, blob_pinned, server):
    path = fetch("pinned", progress=False)
    assert path.read_bytes() == TINY
    (server[0] / "pinned.csv").unlink()  # a second resolve must not download: the cached copy verifies
    assert resolve("pinned") == path
    path.write_bytes(TINY + b"7,ChatGPT,1,1,2,Conversation log\n")  # a changed cache copy is not trusted
    with pytest.raises(TraceError, match="cannot download"):
        resolve("pinned")


def test_a_blob_pinned_download_with_other_bytes_is_refused_and_leaves_nothing(cache, blob_pinned, server):
    (server[0] / "pinned.csv").write_bytes(TINY.replace(b"472", b"473"))
    with pytest.raises(TraceError, match="expected git blob id " + blob_pinned.git_blob_sha1):
        fetch("pinned", progress=False)
    assert _files(cache) == []


def test_an_entry_needs_exactly_one_pin():
    fields = ("x", "x", "x.csv", "burstgpt")
    with pytest.raises(ValueError, match="exactly one of sha256 and git_blob_sha1"):
        TraceEntry(*fields, None, None, 1, "MIT", "https://example.org/x.csv", "s")
    with pytest.raises(ValueError, match="exactly one of sha256 and git_blob_sha1"):
        TraceEntry(*fields, "0" * 64, 1, 1, "MIT", "https://example.org/x.csv", "s", git_blob_sha1="0" * 40)
    with pytest.raises(ValueError, match="a derived file needs the sha256"):
        TraceEntry(*fields, None, None, 1, "MIT", "https://example.org/x.csv", "s", derive="lmsys-drop-text",
                   git_blob_sha1="0" * 40)


def test_a_blob_pinned_download_past_the_entrys_own_size_cap_is_refused(cache, blob_pinned, monkeypatch):
    capped = dataclasses.replace(blob_pinned, size_cap_bytes=len(TINY) - 1)
    monkeypatch.setitem(registry_module.TRACES, "pinned", capped)
    with pytest.raises(TraceError, match=f"more than the registry's {len(TINY) - 1:,}"):
        fetch("pinned", progress=False)
    assert not (cache / "pinned").exists()
    monkeypatch.setitem(registry_module.TRACES, "pinned", dataclasses.replace(capped, size_cap_bytes=len(TINY)))
    assert fetch("pinned", progress=False).read_bytes() == TINY
