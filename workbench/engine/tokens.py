"""Token identity: the one owner of "the token id at position p of sequence s".

A sequence's tokens are its request's prompt, then what it generated. Sample j of a request
generates the segment keyed `output_key(request_id, j)` (workbench.workload.request), so generated
ids are a pure function of (request, sample, offset); a beam's tokens are chosen by
`workbench.workload.beam` instead and are stored here explicitly. The scheduler writes this store
(admission, beam forks and prunes, completion); the kernel runner reads it to rebuild a sequence's
KV from its logical tokens.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.engine import rules
from workbench.workload.request import Request, output_key_of, segment_tokens_at


class TokenStore:
    """Token ids of the live sequences. Mutating calls say so."""

    def __init__(self) -> None:
        self._key = np.zeros(1024, dtype=np.uint64)  # [seq_id] segment key of the generated tokens
        self._request: dict[int, Request] = {}
        self._beam: dict[int, list[int]] = {}  # beam sequence -> its generated token ids
        self._unkeyed: dict[int, list[int]] = {}  # request id -> its sequences, keys not computed yet

    def held_in_common(self, request: Request, seq_ids: list[int], generated: int) -> np.ndarray:
        """Token ids every sequence of a group (`seq_ids`, each having generated `generated` tokens) holds
        in common, int32: the prompt, and for a single recomputed sequence what it generated too (several
        sequences each append their own after it)."""
        if len(seq_ids) == 1 and generated:
            return self.logical(seq_ids[0], rules.recompute_tokens(request.prompt_tokens, generated))
        return request.prompt_token_ids()

    def append_own(self, strategy: Strategy, seq_ids: list[int], offset: int, copies: list[np.ndarray]) -> None:
        """Mutates the strategy: every sequence appends its own generated token `offset` (recomputed after
        a preemption), one slot each; copy-on-write pairs go to `copies`."""
        if strategy.wants_token_ids:
            ids = np.asarray(seq_ids, dtype=np.int64)
            result = strategy.append_recomputed(seq_ids, self.generated(ids, np.full(ids.shape[0], offset)))
        else:
            result = strategy.append_recomputed(seq_ids)
        if len(result.copies):
            copies.append(result.copies)

    def add(self, seq_ids: list[int], request: Request) -> None:
        """Mutates. The sequences are `request`'s samples 0, 1, ... in this order. Their keys are
        computed at the first query: most runs never ask for a generated token id."""
        for seq_id in seq_ids:
            self._request[seq_id] = request
        self._unkeyed[request.request_id] = seq_ids

    def fork(self, parent_id: int, child_id: int, beam_tokens: list[int]) -> None:
        """Mutates. A new beam of the parent's request whose generated tokens are `beam_tokens` (a
        beam's tokens are all stored, so its segment key is never read)."""
        self._fit(child_id)
        self._request[child_id] = self._request[parent_id]
        self._beam[child_id] = beam_tokens

    def set_beam(self, seq_id: int, beam_tokens: list[int]) -> None:
        """Mutates. The sequence is a beam whose generated tokens are `beam_tokens`."""
        self._beam[seq_id] = beam_tokens

    def beam(self, seq_id: int) -> list[int]:
        return self._beam.get(seq_id, [])

    def remove(self, seq_id: int) -> None:
        """Mutates. The sequence is gone for good (finished, rejected, or a pruned beam); its request is
        forgotten with its last sequence."""
        request = self._request.pop(seq_id, None)
        self._beam.pop(seq_id, None)
        if request is not None:
            unkeyed = self._unkeyed.get(request.request_id)
            if unkeyed is not None and not any(s in self._request for s in unkeyed):
                del self._unkeyed[request.request_id]

    def request_id(self, seq_id: int) -> int:
        return self._request[seq_id].request_id

    def generated(self, seq_ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Generated token `offsets[i]` of sequence `seq_ids[i]`, int32 [S] (vectorized over the batch)."""
        if self._unkeyed:
            self._compute_keys()
        tokens = np.empty(seq_ids.shape[0], dtype=np.int32)
        segment_tokens_at(self._key, np.asarray(seq_ids, dtype=np.int64), np.asarray(offsets, dtype=np.int64), tokens)
        if self._beam:
            for i, seq_id in enumerate(seq_ids.tolist()):
                beam = self._beam.get(seq_id)
                if beam is not None:
                    tokens[i] = beam[offsets[i]]
        return tokens

    def logical(self, seq_id: int, length: int) -> np.ndarray:
        """Token ids of positions [0, length) of the sequence, int32: prompt, then generated tokens."""
        prompt = self._request[seq_id].prompt_token_ids()
        p = prompt.shape[0]
        if length <= p:
            return prompt[:length]
        offsets = np.arange(length - p)
        return np.concatenate([prompt, self.generated(np.full(length - p, seq_id), offsets)])

    def _compute_keys(self) -> None:
        """Mutates. Keys of every sequence added since the last call (a step adds a few: one compiled scalar
        call each, cheaper than gathering them into arrays)."""
        for request_id, seq_ids in self._unkeyed.items():
            self._fit(max(seq_ids))
            for sample, seq_id in enumerate(seq_ids):
                self._key[seq_id] = output_key_of(request_id, sample)
        self._unkeyed.clear()

    def _fit(self, seq_id: int) -> None:
        if seq_id >= self._key.shape[0]:
            grow = max(seq_id + 1, 2 * self._key.shape[0]) - self._key.shape[0]
            self._key = np.concatenate([self._key, np.zeros(grow, dtype=np.uint64)])
