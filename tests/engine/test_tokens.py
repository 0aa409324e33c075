"""The token store: prompt then generated ids, samples keyed apart, beams stored explicitly."""

from __future__ import annotations

import numpy as np

from workbench.engine.tokens import TokenStore
from workbench.workload.request import Request, Segment, output_key, token_ids_for


def request(request_id=7, prompt=5, output=6, n=1):
    return Request(request_id, 0.0, prompt, output, (Segment(11, prompt),), n=n)


def test_logical_tokens_are_the_prompt_then_each_samples_own_segment():
    store = TokenStore()
    req = request(n=3)
    store.add([4, 5, 6], req)
    prompt = token_ids_for(11, 0, 5)
    for sample, seq_id in enumerate([4, 5, 6]):
        expected = np.concatenate([prompt, token_ids_for(output_key(7, sample), 0, 6)])
        assert store.logical(seq_id, 11).tolist() == expected.tolist()
        assert store.logical(seq_id, 3).tolist() == prompt[:3].tolist()
    assert store.request_id(5) == 7


def test_generated_is_the_vectorized_logical():
    store = TokenStore()
    store.add([0, 1], request(request_id=1, n=2))
    store.add([2000], request(request_id=2))  # far past the initial capacity: the store grows
    ids = np.array([0, 1, 2000, 1])
    offsets = np.array([0, 3, 5, 1])
    got = store.generated(ids, offsets)
    for seq_id, off, tok in zip(ids, offsets, got, strict=True):
        assert store.logical(int(seq_id), 5 + int(off) + 1)[-1] == tok


def test_beam_tokens_override_the_segment_and_forks_inherit_the_request():
    store = TokenStore()
    store.add([0, 1], Request(3, 0.0, 5, 6, (Segment(11, 5),), beam_width=2))
    store.set_beam(0, [10, 11])
    store.fork(0, 9, [10, 12])
    assert store.logical(0, 7)[-2:].tolist() == [10, 11]
    assert store.logical(9, 7)[-2:].tolist() == [10, 12]
    assert store.generated(np.array([9, 0]), np.array([1, 1])).tolist() == [12, 11]
    assert store.request_id(9) == 3
    store.remove(0)
    assert store.beam(0) == [] and store.beam(9) == [10, 12]
