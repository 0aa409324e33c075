"""A workload as columns: the requests of a run, each built only when the engine reaches it.

`finalize` (workbench.workload.table) returns a `RequestColumns`: arrival times, lengths and content
keys in NumPy arrays (about 24 bytes a request, where a `Request` object with its content costs a few
hundred), read as a sequence of `Request`s. The engine reads each request once, when it arrives, and
lets it go when it is done, so a trace of millions of requests never sits in memory as Python
objects. `list(columns)` gives the same requests as plain objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, overload

import numpy as np

from workbench.workload.request import Request, Segment


class RequestColumns(Sequence[Request]):
    """Requests 0..N-1 (ids = positions). Immutable."""

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, *,
                 unique_keys: np.ndarray | None, contents: list[tuple[Segment, ...]] | None, n: int,
                 beam_width: int, sessions: list[str | None] | None) -> None:
        """`unique_keys` (uint64 [N]): request i's prompt is one segment `Segment(unique_keys[i], prompt)`;
        else `contents[i]` is its prompt. `sessions`: None when no request has a session."""
        if (unique_keys is None) == (contents is None):
            raise ValueError("give either unique_keys or contents")
        self.arrival_s = arrival_s  # float64 [N]
        self.prompt_tokens = prompt_tokens  # int32 [N]
        self.output_tokens = output_tokens  # int32 [N]
        self.unique_keys = unique_keys
        self.contents = contents
        self.n = n
        self.beam_width = beam_width
        self.sessions = sessions

    def __len__(self) -> int:
        return self.arrival_s.shape[0]

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same requests, in the same order."""
        if isinstance(other, RequestColumns):
            return (np.array_equal(self.arrival_s, other.arrival_s)
                    and np.array_equal(self.prompt_tokens, other.prompt_tokens)
                    and np.array_equal(self.output_tokens, other.output_tokens)
                    and (self.n, self.beam_width, self.sessions) == (other.n, other.beam_width, other.sessions)
                    and list(self._contents()) == list(other._contents()))
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # mutable-looking and compared by value: not a dict key

    def _contents(self):
        if self.contents is not None:
            return iter(self.contents)
        return ((Segment(int(k), int(p)),) for k, p in zip(self.unique_keys, self.prompt_tokens, strict=True))

    @overload
    def __getitem__(self, i: int) -> Request: ...

    @overload
    def __getitem__(self, i: slice) -> list[Request]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"request {i} of {len(self)}")
        prompt = int(self.prompt_tokens[i])
        content = (Segment(int(self.unique_keys[i]), prompt),) if self.contents is None else self.contents[i]
        return Request(i, float(self.arrival_s[i]), prompt, int(self.output_tokens[i]), content, self.n,
                       self.beam_width, None if self.sessions is None else self.sessions[i])


class RequestFields(NamedTuple):
    """requests.parquet's own columns of a range of requests: int64, float64, int64, int64 arrays [hi - lo]
    from columns; from a list of requests, lists of Python numbers (as a DataFrame has always read them)."""

    request_id: np.ndarray | list[int]
    arrival_s: np.ndarray | list[float]
    prompt_tokens: np.ndarray | list[int]
    output_tokens: np.ndarray | list[int]


def request_columns(requests: Sequence[Request], lo: int, hi: int) -> RequestFields:
    """The id, arrival and lengths of requests [lo, hi), read from the columns when there are columns."""
    if isinstance(requests, RequestColumns):
        return RequestFields(np.arange(lo, hi, dtype=np.int64), requests.arrival_s[lo:hi].astype(np.float64),
                             requests.prompt_tokens[lo:hi].astype(np.int64),
                             requests.output_tokens[lo:hi].astype(np.int64))
    part = requests[lo:hi]
    return RequestFields([r.request_id for r in part], [r.arrival_s for r in part], [r.prompt_tokens for r in part],
                         [r.output_tokens for r in part])


def any_beam_search(requests: Sequence[Request]) -> bool:
    """Whether a request of the workload searches with beams (read from the columns when there are columns)."""
    if isinstance(requests, RequestColumns):
        return requests.beam_width > 1 and len(requests) > 0
    return any(r.beam_width > 1 for r in requests)


def shortest_request(requests: Sequence[Request]) -> Request:
    """The request with the fewest prompt + output tokens (the first such)."""
    if isinstance(requests, RequestColumns):
        total = requests.prompt_tokens.astype(np.int64) + requests.output_tokens
        return requests[int(np.argmin(total))]
    return min(requests, key=lambda r: (r.prompt_tokens + r.output_tokens, r.request_id))
