"""The request type, its token content, and a workload as columns (`RequestColumns`).

A prompt's content is a tuple of `Segment(key, length)`: the token at offset i of a segment is a
pure function of (key, i). Two prompts that start with the same segments therefore have identical
token ids over that span, which is what makes prefix identity (and prefix caching) real without
storing every token id: a Mooncake prompt of 120k tokens is ~240 segments, not 120k integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

import numpy as np
from numba import int32, njit, uint64

from workbench.splitmix import elementwise, mix

VOCAB_SIZE = 50_272  # OPT's vocabulary; token ids lie in [0, VOCAB_SIZE)

@dataclass(frozen=True, slots=True)
class Segment:
    """`length` tokens whose ids are `token_ids_for(key, 0..length-1)`."""

    key: int
    length: int


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the engine replays it. With `n` > 1 the n samples share the prompt and each
    generates `output_tokens` tokens, sample j's tokens keyed `output_key(request_id, j)`; with
    `beam_width` > 1 the beams fork and prune as `workbench.workload.beam` prescribes."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    content: tuple[Segment, ...]  # lengths sum to prompt_tokens
    n: int = 1  # parallel samples sharing the prompt
    beam_width: int = 1  # beam search width (1 = no beam search)
    session_id: str | None = None
    # speculative decoding (workbench.engine.speculation): drafts each of its verify steps accepts, from a trace's
    # `accepted` column; -1: drawn from --spec-accept
    accepted: int = -1

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1, got {self.output_tokens}")
        if self.n < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: n and beam_width must be >= 1")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError(f"request {self.request_id}: parallel sampling and beam search are exclusive")
        if self.accepted < -1:
            raise ValueError(f"request {self.request_id}: accepted must be >= 0 drafts (or -1: none given), got "
                             f"{self.accepted}")
        if sum(s.length for s in self.content) != self.prompt_tokens:
            raise ValueError(f"request {self.request_id}: content covers "
                             f"{sum(s.length for s in self.content)} tokens, prompt has {self.prompt_tokens}")

    @property
    def output_key(self) -> int:
        """Segment key of the tokens this request generates (sample 0). A later turn of the same
        session embeds `Segment(output_key, output_tokens)` so its prompt repeats this answer."""
        return output_key(self.request_id, 0)

    def prompt_token_ids(self) -> np.ndarray:
        """Token ids of the prompt, int32 [prompt_tokens]."""
        return content_token_ids(self.content)


def output_key(request_id: int, sample: int) -> int:
    """Segment key for the generated tokens of one sample of one request."""
    return int(output_key_of(request_id, sample))


@njit(cache=True)
def output_key_of(request_id, sample):
    """`output_key` for compiled and scalar callers (any integers, taken as uint64): the one statement of it,
    which `output_keys` applies elementwise."""
    return mix((uint64(request_id) << uint64(20)) ^ uint64(sample) ^ uint64(1 << 62)) >> uint64(1)


def output_keys(request_ids: np.ndarray, samples: np.ndarray | int) -> np.ndarray:
    """`output_key` vectorized: uint64 keys of (request id, sample) pairs, the two arguments broadcast."""
    return elementwise(_output_keys, np.uint64, np.asarray(request_ids, dtype=np.uint64),
                       np.asarray(samples, dtype=np.uint64))


@njit(cache=True)
def _output_keys(request_ids, samples, keys):
    for i in range(keys.shape[0]):
        keys[i] = output_key_of(request_ids[i], samples[i])


def segment_token_ids(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The token at `offsets[i]` of the segment keyed `keys[i]`, int32 [S] (keys and offsets broadcast):
    `segment_token`, the one definition of a segment's content, elementwise."""
    return elementwise(_segment_tokens, np.int32, np.asarray(keys, dtype=np.uint64), np.asarray(offsets))


@njit(cache=True)
def segment_token(key, offset):
    """The token at `offset` (uint64) of the segment keyed `key` (uint64), arithmetic wrapping modulo 2^64:
    the one statement of it, which `segment_token_ids` and `token_ids_for` apply elementwise."""
    return int32(mix(offset ^ (key * uint64(0x100000001B3))) % uint64(VOCAB_SIZE))


@njit(cache=True)
def _segment_tokens(keys, offsets, tokens):
    segment_tokens_at(keys, np.arange(keys.shape[0]), offsets, tokens)


# a compiled loop, not a Numba ufunc: loading a ufunc from the cache rebuilds its wrapper (~0.1 s in every
# process), and a decode step's call would pay its dispatch (~1.5 µs, more than the hashing of the batch)
@njit(cache=True)
def segment_tokens_at(keys, index, offsets, tokens):
    """`tokens[i]` = `segment_token(keys[index[i]], offsets[i])`: the keys gathered in the same pass (a decode
    step's batch reads its sequences' keys from a table, `TokenStore.generated`)."""
    for i in range(index.shape[0]):
        tokens[i] = segment_token(keys[index[i]], uint64(offsets[i]))


def token_ids_for(key: int, start: int, stop: int) -> np.ndarray:
    """Token ids at offsets [start, stop) of the segment with this key, int32."""
    tokens = np.empty(max(stop - start, 0), dtype=np.int32)
    _segment_run(np.uint64(key & 0xFFFFFFFFFFFFFFFF), np.uint64(start), tokens)
    return tokens


@njit(cache=True)
def _segment_run(key, start, tokens):
    for i in range(tokens.shape[0]):
        tokens[i] = segment_token(key, start + uint64(i))


def content_token_ids(content: tuple[Segment, ...]) -> np.ndarray:
    """Concatenated token ids of a content tuple, int32 [sum of lengths]."""
    if len(content) == 1:  # most prompts: no list to concatenate
        return token_ids_for(content[0].key, 0, content[0].length)
    if not content:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate([token_ids_for(s.key, 0, s.length) for s in content])

# A workload as columns: `finalize` (workbench.workload.table) returns a `RequestColumns`, arrival times,
# lengths and content keys in NumPy arrays (about 24 bytes a request, where a `Request` object with its
# content costs a few hundred), read as a sequence of `Request`s. The engine reads each request once,
# when it arrives, and lets it go when it is done, so a trace of millions of requests never sits in
# memory as Python objects. `list(columns)` gives the same requests as plain objects.


class RequestColumns(Sequence[Request]):
    """Requests 0..N-1 (ids = positions). Immutable."""

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray, *,
                 unique_keys: np.ndarray | None, contents: list[tuple[Segment, ...]] | None, n: int,
                 beam_width: int, sessions: list[str | None] | None, failed_rows_dropped: int = 0,
                 accepted: np.ndarray | None = None) -> None:
        """`unique_keys` (uint64 [N], or read like one: `table.UniqueKeys`): request i's prompt is one segment
        `Segment(unique_keys[i], prompt)`; else `contents[i]` is its prompt. `sessions`: None when no request
        has a session."""
        if (unique_keys is None) == (contents is None):
            raise ValueError("give either unique_keys or contents")
        _check_columns(prompt_tokens, output_tokens, contents, n, beam_width)
        self.arrival_s = arrival_s  # float64 [N]
        self.prompt_tokens = prompt_tokens  # int32 [N]
        self.output_tokens = output_tokens  # int32 [N]
        self.unique_keys = unique_keys
        self.contents = contents
        self.n = n
        self.beam_width = beam_width
        self.sessions = sessions
        self.failed_rows_dropped = failed_rows_dropped  # trace rows the reader dropped as failed, before these
        self.accepted = accepted  # int32 [N]: a trace's `accepted` column (Request.accepted); None: none given

    def __len__(self) -> int:
        return self.arrival_s.shape[0]

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same requests, in the same order."""
        if isinstance(other, RequestColumns):
            return (np.array_equal(self.arrival_s, other.arrival_s)
                    and np.array_equal(self.prompt_tokens, other.prompt_tokens)
                    and np.array_equal(self.output_tokens, other.output_tokens)
                    and (self.n, self.beam_width, self.sessions) == (other.n, other.beam_width, other.sessions)
                    and (self.accepted is None) == (other.accepted is None)
                    and (self.accepted is None or np.array_equal(self.accepted, other.accepted))
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
        if self.contents is None:
            segment = _new(Segment)
            _set(segment, "key", int(self.unique_keys[i]))
            _set(segment, "length", prompt)
            content = (segment,)
        else:
            content = self.contents[i]
        # the fields set one by one, `Request.__post_init__` skipped: the engine reads each request of a
        # columns workload once, and `_check_columns` checked them all already
        request = _new(Request)
        _set(request, "request_id", i)
        _set(request, "arrival_s", float(self.arrival_s[i]))
        _set(request, "prompt_tokens", prompt)
        _set(request, "output_tokens", int(self.output_tokens[i]))
        _set(request, "content", content)
        _set(request, "n", self.n)
        _set(request, "beam_width", self.beam_width)
        _set(request, "session_id", None if self.sessions is None else self.sessions[i])
        _set(request, "accepted", -1 if self.accepted is None else int(self.accepted[i]))
        return request


_new, _set = object.__new__, object.__setattr__  # how a frozen dataclass's own __init__ sets its fields


def _check_columns(prompt: np.ndarray, output: np.ndarray, contents: list[tuple[Segment, ...]] | None, n: int,
                   beam_width: int) -> None:
    """What `Request` checks of each request, for the whole workload at once: the same error, about the
    first request that breaks a rule, before anything runs."""
    for lengths, name in ((prompt, "prompt_tokens"), (output, "output_tokens")):
        bad = np.flatnonzero(lengths < 1)
        if bad.shape[0]:
            raise ValueError(f"request {bad[0]}: {name} must be >= 1, got {lengths[bad[0]]}")
    if len(prompt) and (n < 1 or beam_width < 1):
        raise ValueError("request 0: n and beam_width must be >= 1")
    if len(prompt) and n > 1 and beam_width > 1:
        raise ValueError("request 0: parallel sampling and beam search are exclusive")
    if contents is not None:
        for i, (content, p) in enumerate(zip(contents, prompt.tolist(), strict=True)):
            covered = sum(part.length for part in content)
            if covered != p:
                raise ValueError(f"request {i}: content covers {covered} tokens, prompt has {p}")


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


def failed_rows_dropped(requests: Sequence[Request]) -> int:
    """Rows of the trace its reader dropped as failed before these requests (0 for requests built in code)."""
    return requests.failed_rows_dropped if isinstance(requests, RequestColumns) else 0


def shortest_request(requests: Sequence[Request]) -> Request:
    """The request with the fewest prompt + output tokens (the first such)."""
    if isinstance(requests, RequestColumns):
        total = np.add(requests.prompt_tokens, requests.output_tokens, dtype=np.int64)
        return requests[int(np.argmin(total))]
    return min(requests, key=lambda r: (r.prompt_tokens + r.output_tokens, r.request_id))
