"""Rows with zero tokens: what a trace reader does with them, said out loud in the workload's notes.

A row with 0 output tokens is a failed request (BurstGPT logs failures as 0 request and 0 response
tokens; the Alpaca subset has two empty answers). `failed=drop` (the default) removes such rows;
`failed=keep` keeps each as the smallest request the engine can run: its prompt (at least 1 token)
and 1 output token, so the published arrival process is replayed exactly. Either way the count is
reported: in the workload's notes, and for a run on stderr and as the summary's `num_failed_rows_dropped`. A
row with a 0-token prompt but a non-empty answer is not a failure but bad data: an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.errors import WorkloadError

FAILED_CHOICES = ("drop", "keep")


def settle_failed(
    path: Path, lines: np.ndarray, prompt: np.ndarray, output: np.ndarray, *, failed: str,
    prompt_field: str, output_field: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(kept row indices int64 [kept], prompt_tokens [kept], output_tokens [kept], notes, failed rows dropped)."""
    empty_prompt = (prompt == 0) & (output > 0)
    if empty_prompt.any():
        i = int(np.argmax(empty_prompt))
        raise WorkloadError(path, int(lines[i]), prompt_field, "at least 1 prompt token when the output is not "
                            "empty", int(prompt[i]))
    is_failed = output == 0  # [rows]
    num_failed = int(is_failed.sum())
    notes = []
    if failed == "drop":
        kept = np.flatnonzero(~is_failed)
        if num_failed:
            notes.append(f"dropped {num_failed} failed rows ({output_field} = 0); failed=keep keeps them")
        if len(kept) == 0:
            raise WorkloadError(path, None, output_field, "at least one row with a non-zero value; every row failed")
        return kept, prompt[kept], output[kept], notes, num_failed
    if num_failed:
        notes.append(f"kept {num_failed} failed rows ({output_field} = 0) as 1-token-output requests")
    return np.arange(len(prompt)), np.maximum(prompt, 1), np.maximum(output, 1), notes, 0
