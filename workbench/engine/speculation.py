"""Speculative decoding (docs/speculative.md): how far each decoding sequence advances in one verify step.

A decoding sequence with `left` tokens still to generate writes, in one step, the KV of its last token and of
d = min(k, left - 1) draft tokens (vLLM's lookahead slots), and the target model verifies the d + 1 query
tokens. It keeps the rows of its last token and of the `a` drafts accepted (a <= d) and advances by a + 1
tokens: the target samples one more token after the accepted drafts, whose KV the next step writes. The d - a
rejected rows are rolled back. With k = 0 nothing is drafted and every step advances one token, as without
speculation.

Acceptance is a pure function of (seed, request, tokens the request had generated before the step): draft j
is accepted when the draft before it was and a uniform draw u (splitmix64 of the three) is below alpha^j, so
P(a >= j) = alpha^j, the per-token acceptance model of the speculative-decoding papers (Leviathan et al.
2023). The same seed gives the same accepted lengths, and a recomputed request drafts again what it drafted
before its preemption.
"""

from __future__ import annotations

import numpy as np

from workbench.splitmix import mix64

_REQUEST_MUL = np.uint64(0xD6E8FEB86659FD93)
_GENERATED_MUL = np.uint64(0xA0761D6478BD642F)
_UNIT = 2.0 ** -53  # a draw's top 53 bits as a double in [0, 1)


class Speculation:
    """Pure: k draft tokens per step and the per-token acceptance probability alpha, seeded."""

    def __init__(self, k: int, alpha: float, seed: int) -> None:
        if k < 1:
            raise ValueError(f"spec_tokens must be >= 1 when drafting, got {k}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"spec_accept must be in (0, 1], got {alpha}")
        self.k = k
        self.alpha = alpha
        self._seed = mix64(np.uint64(seed) ^ np.uint64(0x5BEC))
        # alpha^j for j = 1..k, by repeated multiplication: the same doubles on every machine
        powers = np.empty(k)
        p = 1.0
        for j in range(k):
            p *= alpha
            powers[j] = p
        self._powers = powers  # float64 [k], non-increasing

    def drafts(self, left: np.ndarray) -> np.ndarray:
        """Draft tokens each sequence writes this step: min(k, left - 1), int64 (`left`: tokens still to
        generate, >= 1)."""
        return np.minimum(self.k, left - 1)

    def accepted(self, requests: np.ndarray, generated: np.ndarray, drafts: np.ndarray,
                 given: np.ndarray | None = None) -> np.ndarray:
        """Drafts accepted of `drafts` (int64 each), for requests (their workload indices) that had generated
        `generated` tokens before the step. `given`: each request's own accepted length from the trace's
        `accepted` column (-1 where it has none: drawn), capped by its drafts."""
        drawn = self._drawn(requests, generated, drafts)
        return drawn if given is None else np.where(given >= 0, np.minimum(given, drafts), drawn)

    def _drawn(self, requests: np.ndarray, generated: np.ndarray, drafts: np.ndarray) -> np.ndarray:
        h = mix64(self._seed ^ mix64(requests.astype(np.uint64) * _REQUEST_MUL
                                     ^ generated.astype(np.uint64) * _GENERATED_MUL))
        u = (h >> np.uint64(11)).astype(np.float64) * _UNIT  # [n] in [0, 1)
        # the leading run of accepted drafts: alpha^j non-increasing, so u < alpha^j holds for j = 1..a
        a = np.count_nonzero(u[:, None] < self._powers[None, :], axis=1)
        return np.minimum(a, drafts)

    def steps_to_finish(self, request: int, generated: int, output_tokens: int, given: int = -1) -> int:
        """Verify steps a request that has generated `generated` of its `output_tokens` tokens takes to finish
        (each advances it by its accepted drafts + 1; `given` as for `accepted`)."""
        # the step that starts at each generated count the request can reach, drawn at once; then the walk
        reachable = np.arange(generated, output_tokens, dtype=np.int64)  # [output - generated]
        n = reachable.shape[0]
        advance = (self.accepted(np.full(n, request, dtype=np.int64), reachable,
                                 self.drafts(output_tokens - reachable), np.full(n, given, dtype=np.int64))
                   + 1).tolist()
        steps, at = 0, 0
        while at < n:
            at += advance[at]
            steps += 1
        return steps
