"""A workload's token content as arrays, for a compiled step loop whose strategy reads token ids (a prefix
cache: workbench.allocators.prefix.compiled_cache).

A prompt is a run of segments (`workbench.workload.request.Segment`), each a key and a length; here every
request's segments lie in three flat arrays, and `fill_tokens` writes the ids the general loop's `TokenStore`
gives for the same positions: the prompt, then the tokens the request generated (the segment keyed
`output_key` of its id and sample 0: the loop runs one sequence per request). `segment_token` is the one
statement of a token's id.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, uint64

from workbench.workload.request import RequestColumns, output_keys, segment_token


class PromptSegments(NamedTuple):
    """Request i's segments are [seg_start[i], seg_start[i + 1]) of `seg_key` and `seg_len`; the tokens it
    generates are the segment keyed `output_key[i]`."""

    seg_start: np.ndarray  # int64 [N + 1]
    seg_key: np.ndarray  # uint64 [num segments]
    seg_len: np.ndarray  # int64 [num segments]
    output_key: np.ndarray  # uint64 [N]


def prompt_segments(requests) -> PromptSegments:
    """Pure. The segments of every request of `requests` (a `RequestColumns` or a list of `Request`s)."""
    n = len(requests)
    if isinstance(requests, RequestColumns) and requests.contents is None:  # one segment each: the columns
        keys = np.fromiter(iter(requests.unique_keys), dtype=np.uint64, count=n)
        return PromptSegments(np.arange(n + 1, dtype=np.int64), keys, requests.prompt_tokens.astype(np.int64),
                              output_keys(np.arange(n), 0))
    if isinstance(requests, RequestColumns):
        contents, ids = requests.contents, range(n)
    else:
        contents, ids = [r.content for r in requests], [r.request_id for r in requests]
    counts = np.fromiter((len(c) for c in contents), dtype=np.int64, count=n)
    seg_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=seg_start[1:])
    flat = [s for c in contents for s in c]
    keys = np.array([s.key & 0xFFFFFFFFFFFFFFFF for s in flat], dtype=np.uint64)
    lengths = np.array([s.length for s in flat], dtype=np.int64)
    return PromptSegments(seg_start, keys, lengths, output_keys(np.fromiter(ids, dtype=np.int64, count=n), 0))


@njit(cache=True)
def fill_tokens(seg_start, seg_key, seg_len, output_key, i, prompt, num_tokens, out):
    """Writes into `out[:num_tokens]` (int32) the ids of request i's first `num_tokens` tokens: its prompt
    (`prompt` tokens), then the tokens it generated (`TokenStore.logical`)."""
    t = 0
    for s in range(seg_start[i], seg_start[i + 1]):
        for k in range(seg_len[s]):
            if t == num_tokens:
                return
            out[t] = segment_token(seg_key[s], uint64(k))
            t += 1
    for k in range(num_tokens - prompt):
        out[t + k] = segment_token(output_key[i], uint64(k))
