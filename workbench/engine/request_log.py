"""Per-request records of a run (requests.parquet) and the run's request counters.

Rows are kept only for the requests still open: from the first request not yet finished or rejected
up to the last one seen. Once every request below some index is done, those rows can be taken out
(`take_done`) and handed to the run's table sink, so the log's memory follows the requests in flight,
not the length of the trace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.engine import rules
from workbench.workload.request import Request, request_columns

_FLOAT_FIELDS = ("admitted_s", "first_token_s", "finish_s")
_INT_FIELDS = ("prefix_hit_tokens", "num_preemptions", "accepted_tokens")


def rejected_status(reason: str) -> str:
    """A rejected request's status column."""
    return f"rejected: {reason}"


class RequestLog:
    """One row per request, NaN until the event happens. Every method but `status_of` mutates."""

    def __init__(self, num_requests: int = 0, *, speculative: bool = False) -> None:
        """`speculative`: the table has an `accepted_tokens` column (speculative decoding's drafts accepted)."""
        self.num_requests = num_requests  # requests given so far; rows below `base` were taken out
        self.base = 0
        self.ready = 0  # every request below this index is done (finished or rejected)
        capacity = 1024
        self.admitted_s = np.full(capacity, np.nan)
        self.first_token_s = np.full(capacity, np.nan)
        self.finish_s = np.full(capacity, np.nan)
        self.prefix_hit_tokens = np.zeros(capacity, dtype=np.int64)
        self.num_preemptions = np.zeros(capacity, dtype=np.int64)
        self.speculative = speculative
        self.accepted_tokens = np.zeros(capacity, dtype=np.int64)
        self.done = np.zeros(capacity, dtype=bool)
        self.status: list[str] = ["pending"] * capacity  # of rows base .. base + capacity
        self.generated_tokens = 0  # tokens of finished requests, every sample counted
        self.num_rejected = 0
        self.num_finished = 0

    def grow(self, num_requests: int) -> None:
        """Rows for `num_requests` more requests (a fleet routes them to a replica as they arrive), held from
        now on: a fleet's router reads the rows of requests routed and not yet admitted."""
        self.num_requests += num_requests
        self._row(self.num_requests - 1)

    def make_room(self, index: int) -> None:
        """Mutates. The window holds request `index`'s row (a compiled loop writes the arrays directly)."""
        self._row(index)

    def _row(self, index: int) -> int:
        """The window position of request `index`, the window grown (at least doubled) to hold it."""
        j = index - self.base
        if j >= self.done.shape[0]:
            self._resize(max(2 * self.done.shape[0], j + 1), 0)
        return j

    def _resize(self, capacity: int, drop: int) -> None:
        """The window holds `capacity` rows after dropping its first `drop`."""
        keep = self.done.shape[0] - drop
        for name in (*_FLOAT_FIELDS, *_INT_FIELDS, "done"):
            old = getattr(self, name)
            fill = np.nan if name in _FLOAT_FIELDS else 0
            new = np.full(capacity, fill, dtype=old.dtype)
            new[:min(keep, capacity)] = old[drop:drop + min(keep, capacity)]
            setattr(self, name, new)
        self.status = self.status[drop:drop + min(keep, capacity)] + ["pending"] * max(0, capacity - keep)

    def admitted(self, index: int, now_s: float, cached_tokens: int) -> None:
        """The request's group got its KV (again, after a recompute preemption)."""
        j = self._row(index)
        self.admitted_s[j] = rules.first_time(self.admitted_s[j], now_s)
        self.prefix_hit_tokens[j] += cached_tokens

    def first_token(self, index: int, now_s: float) -> None:
        j = self._row(index)
        self.first_token_s[j] = rules.first_time(self.first_token_s[j], now_s)

    def accepted(self, indices: np.ndarray, accepted: np.ndarray) -> None:
        """Requests `indices` (distinct) kept `accepted` draft tokens each in a verify step."""
        self._row(int(indices.max(initial=self.base)))
        self.accepted_tokens[indices - self.base] += accepted

    def preempted(self, index: int) -> None:
        self.num_preemptions[self._row(index)] += 1

    def finished(self, index: int, now_s: float, generated_tokens: int) -> None:
        j = self._row(index)
        self.finish_s[j] = now_s
        self.status[j] = "finished"
        self.num_finished += 1
        self.generated_tokens += generated_tokens
        self._done(j)

    def rejected(self, index: int, reason: str) -> None:
        j = self._row(index)
        self.num_rejected += 1
        self.status[j] = rejected_status(reason)
        self._done(j)

    def status_of(self, index: int) -> str:
        """Pure. The request's status, while its row is kept."""
        return self.status[index - self.base]

    def _done(self, j: int) -> None:
        self.done[j] = True
        if j == self.ready - self.base:  # the done prefix grows past it, and past what finished before it
            done, k = self.done, j
            while k < done.shape[0] and done[k]:
                k += 1
            self.ready = self.base + k

    def take_done(self, requests: Sequence[Request]) -> pd.DataFrame | None:
        """The rows of the requests below `ready` not taken yet, as a requests.parquet chunk, removed from
        the log (None when there are none)."""
        num = self.ready - self.base
        if num <= 0:
            return None
        frame = self._frame(requests, self.base, self.ready)
        self._resize(self.done.shape[0], num)
        self.base = self.ready
        return frame

    def last_rows(self, requests: Sequence[Request]) -> pd.DataFrame | None:
        """Mutates. At the end of a run: the rows not taken yet, the (empty) table of a run without
        requests, or None when every row was taken already."""
        done = self.take_done(requests)
        if done is not None or self.base:
            return done
        return self.to_frame(requests)

    def to_frame(self, requests: Sequence[Request]) -> pd.DataFrame:
        """requests.parquet (workbench.columns.REQUEST_COLUMNS), every row, for a log none of whose rows
        were taken out (a fleet's replicas merge theirs)."""
        if self.base:
            raise RuntimeError(f"rows below request {self.base} were taken out of this log")
        self._row(self.num_requests - 1)  # rows for requests given but never seen (none arrived yet)
        return self._frame(requests, 0, self.num_requests)

    def _frame(self, requests: Sequence[Request], lo: int, hi: int) -> pd.DataFrame:
        a, b = lo - self.base, hi - self.base
        cols = request_columns(requests, lo, hi)
        return pd.DataFrame({
            "request_id": cols.request_id,
            "arrival_s": cols.arrival_s,
            "admitted_s": self.admitted_s[a:b].copy(),
            "first_token_s": self.first_token_s[a:b].copy(),
            "finish_s": self.finish_s[a:b].copy(),
            "prompt_tokens": cols.prompt_tokens,
            "output_tokens": cols.output_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens[a:b].copy(),
            "num_preemptions": self.num_preemptions[a:b].copy(),
            **({"accepted_tokens": self.accepted_tokens[a:b].copy()} if self.speculative else {}),
            "status": self.status[a:b],
        })
