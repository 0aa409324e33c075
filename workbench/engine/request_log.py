"""Per-request records of a run (requests.parquet) and the run's request counters."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.workload.request import Request


class RequestLog:
    """One row per request of the workload, NaN until the event happens. Every method mutates."""

    def __init__(self, num_requests: int) -> None:
        self.admitted_s = np.full(num_requests, np.nan)
        self.first_token_s = np.full(num_requests, np.nan)
        self.finish_s = np.full(num_requests, np.nan)
        self.prefix_hit_tokens = np.zeros(num_requests, dtype=np.int64)
        self.num_preemptions = np.zeros(num_requests, dtype=np.int64)
        self.status = ["pending"] * num_requests
        self.generated_tokens = 0  # tokens of finished requests, every sample counted
        self.num_rejected = 0
        self.num_finished = 0

    def grow(self, num_requests: int) -> None:
        """Rows for `num_requests` more requests (a fleet routes them to a replica as they arrive); the
        arrays at least double when they grow, so n requests added one by one cost O(n)."""
        size = len(self.status)
        if size + num_requests > self.finish_s.shape[0]:
            capacity = max(2 * self.finish_s.shape[0], size + num_requests)
            for name, fill in (("admitted_s", np.nan), ("first_token_s", np.nan), ("finish_s", np.nan),
                               ("prefix_hit_tokens", 0), ("num_preemptions", 0)):
                old = getattr(self, name)
                new = np.full(capacity, fill, dtype=old.dtype)
                new[:size] = old[:size]
                setattr(self, name, new)
        self.status += ["pending"] * num_requests

    def admitted(self, index: int, now_s: float, cached_tokens: int) -> None:
        """The request's group got its KV (again, after a recompute preemption)."""
        if np.isnan(self.admitted_s[index]):
            self.admitted_s[index] = now_s
        self.prefix_hit_tokens[index] += cached_tokens

    def first_token(self, index: int, now_s: float) -> None:
        if np.isnan(self.first_token_s[index]):
            self.first_token_s[index] = now_s

    def preempted(self, index: int) -> None:
        self.num_preemptions[index] += 1

    def finished(self, index: int, now_s: float, generated_tokens: int) -> None:
        self.finish_s[index] = now_s
        self.status[index] = "finished"
        self.num_finished += 1
        self.generated_tokens += generated_tokens

    def rejected(self, index: int, reason: str) -> None:
        self.num_rejected += 1
        self.status[index] = f"rejected: {reason}"

    def to_frame(self, requests: list[Request]) -> pd.DataFrame:
        """requests.parquet (workbench.columns.REQUEST_COLUMNS)."""
        n = len(self.status)
        return pd.DataFrame({
            "request_id": [r.request_id for r in requests],
            "arrival_s": [r.arrival_s for r in requests],
            "admitted_s": self.admitted_s[:n],
            "first_token_s": self.first_token_s[:n],
            "finish_s": self.finish_s[:n],
            "prompt_tokens": [r.prompt_tokens for r in requests],
            "output_tokens": [r.output_tokens for r in requests],
            "prefix_hit_tokens": self.prefix_hit_tokens[:n],
            "num_preemptions": self.num_preemptions[:n],
            "status": self.status,
        })
