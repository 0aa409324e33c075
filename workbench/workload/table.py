"""A workload before it becomes Requests: columns plus content, and the transforms that finish it.

Readers and generators produce a `RequestTable` (one row per request, in any order); `finalize`
sorts it by arrival, applies the request cap, rate scaling and time window, assigns ids 0..N-1 and
only then resolves content, because a later turn's prompt names an earlier turn's answer by that
turn's final request id (`output_key`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from workbench.splitmix import mix64
from workbench.workload.request import RequestColumns, Segment, output_keys


@dataclass(frozen=True, slots=True)
class OutputRef:
    """The `length` generated tokens (sample 0) of table row `row`; becomes
    `Segment(output_key(final id of row), length)` once ids are assigned."""

    row: int
    length: int


Part = Segment | OutputRef


@dataclass
class RequestTable:
    arrival_s: np.ndarray  # float64 [num_rows]
    prompt_tokens: np.ndarray  # int64 [num_rows], each >= 1
    output_tokens: np.ndarray  # int64 [num_rows], each >= 1
    content: list[tuple[Part, ...]] | None = None  # per row; None: one unique segment per row
    session_id: list[str | None] | None = None  # per row
    notes: list[str] = field(default_factory=list)  # what a reader dropped or changed, said by describe
    failed_rows_dropped: int = 0  # rows of the file a reader dropped as failed requests (workload.failed)
    accepted: np.ndarray | None = None  # int64 [num_rows]: drafts each verify step accepts (Request.accepted)

    def __len__(self) -> int:
        return len(self.arrival_s)


def content_keys(tag: str, ids: np.ndarray) -> np.ndarray:
    """63-bit segment keys for integer `ids` in the namespace `tag`, uint64 [len(ids)].

    Distinct ids give distinct keys within one namespace (mix64 is a bijection); namespaces are
    separated by a 64-bit digest of the tag, so keys of different namespaces collide only by chance.
    """
    salt = np.uint64(int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little"))
    return mix64(np.asarray(ids, dtype=np.uint64) ^ mix64(np.array([salt], dtype=np.uint64))[0]) >> np.uint64(1)


class UniqueKeys:
    """`content_keys(tag, rows)` of a workload's one-segment prompts, read like that uint64 array but computed
    a block at a time when read: a million-request trace would otherwise hold 8 MB of keys for its whole
    run, where the engine reads each key once, in arrival order. Immutable."""

    BLOCK = 4096  # keys computed at once (the block last read is kept)

    def __init__(self, tag: str, rows: np.ndarray) -> None:
        """`rows`: the table row of each request, in request order."""
        self.tag = tag
        # request i's row, int32 [N]; None when request i is row i (a table already in arrival order)
        identity = np.array_equal(rows, np.arange(rows.shape[0]))
        self._rows = None if identity else rows.astype(np.int32 if rows.shape[0] < 2**31 else np.int64)
        self._len = rows.shape[0]
        self._block = -1
        self._keys = np.zeros(0, dtype=np.uint64)  # the keys of block `_block`

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> np.uint64:
        if not 0 <= i < self._len:
            raise IndexError(f"key {i} of {self._len}")
        block = i // self.BLOCK
        if block != self._block:
            self._keys = self._compute(block * self.BLOCK, min((block + 1) * self.BLOCK, self._len))
            self._block = block
        return self._keys[i - block * self.BLOCK]

    def __iter__(self):
        for lo in range(0, self._len, self.BLOCK):
            yield from self._compute(lo, min(lo + self.BLOCK, self._len))

    def _compute(self, lo: int, hi: int) -> np.ndarray:
        rows = np.arange(lo, hi) if self._rows is None else self._rows[lo:hi]
        return content_keys(self.tag, rows)


def finalize(
    table: RequestTable,
    *,
    seed: int,
    rate: float | None = None,
    duration_s: float | None = None,
    num_requests: int | None = None,
    n: int = 1,
    beam_width: int = 1,
) -> RequestColumns:
    """Requests sorted by arrival with ids 0..N-1 and the first arrival at t = 0 (as columns).

    Order of the transforms: stable sort by arrival; keep the first `num_requests`; when `rate` is
    given, stretch time uniformly so the kept requests' mean rate (count / span) equals it; keep
    arrivals < `duration_s`. Rows with content=None get one segment unique to (seed, row).
    """
    order = np.argsort(table.arrival_s, kind="stable")  # [num_rows] table rows in arrival order
    if num_requests is not None:
        order = order[:num_requests]
    # each step in place: a million-request table's columns are what a run's peak memory grows with
    arrival_s = np.asarray(table.arrival_s[order], dtype=np.float64)
    if len(arrival_s):
        arrival_s -= arrival_s[0]
    if rate is not None and len(arrival_s) > 1:
        span_s = arrival_s[-1]
        if span_s <= 0:
            raise ValueError("cannot rescale arrivals to a rate: every request arrives at the same instant")
        with np.errstate(over="ignore"):
            factor = len(arrival_s) / span_s / rate
        if np.isfinite(factor):
            arrival_s *= factor
        else:  # a subnormal span: divide by it first, so the times stay finite (0 .. len / rate)
            arrival_s = arrival_s / span_s * (len(arrival_s) / rate)
    if duration_s is not None:
        keep = int(np.searchsorted(arrival_s, duration_s, side="left"))
        order, arrival_s = order[:keep], arrival_s[:keep]

    prompt, output = _int32_column(table.prompt_tokens, order), _int32_column(table.output_tokens, order)
    sessions = [table.session_id[r] for r in order] if table.session_id is not None else None
    if table.content is None:
        keys, contents = UniqueKeys(f"unique/{seed}", order), None
    else:
        final_id = np.full(len(table), -1, dtype=np.int64)  # [num_rows] request id of each kept row
        final_id[order] = np.arange(len(order))
        answer_keys = output_keys(np.arange(len(order)), 0).tolist()  # [kept] key of each request's answer
        ids = final_id.tolist()
        keys, contents = None, [_resolve(table.content[r], ids, answer_keys, i) for i, r in enumerate(order.tolist())]
    accepted = None if table.accepted is None else _int32_column(table.accepted, order)
    return RequestColumns(arrival_s, prompt, output, unique_keys=keys, contents=contents, n=n, beam_width=beam_width,
                          sessions=sessions, failed_rows_dropped=table.failed_rows_dropped, accepted=accepted)


def _int32_column(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`values[order]` as int32 [len(order)]; ValueError when a value does not fit. One column at a time: a
    million-request table's int64 copies are not held together."""
    taken = values[order]
    if np.iinfo(np.int32).max < int(taken.max(initial=0)):
        raise ValueError(f"a request has more than {np.iinfo(np.int32).max} prompt or output tokens")
    return taken.astype(np.int32)


def _resolve(parts: tuple[Part, ...], final_id: list[int], answer_keys: list[int], request_id: int
             ) -> tuple[Segment, ...]:
    resolved = []
    for part in parts:
        if isinstance(part, OutputRef):
            ref_id = final_id[part.row]
            # The cap and the window keep a prefix of the arrival order, and a turn arrives after the
            # turn it quotes, so the quoted request is always kept and earlier.
            if not 0 <= ref_id < request_id:
                raise RuntimeError(f"request {request_id} quotes row {part.row}, which is not an earlier request")
            part = Segment(answer_keys[ref_id], part.length)
        resolved.append(part)
    return tuple(resolved)
