"""The request type and its token content.

A prompt's content is a tuple of `Segment(key, length)`: the token at offset i of a segment is a
pure function of (key, i). Two prompts that start with the same segments therefore have identical
token ids over that span, which is what makes prefix identity (and prefix caching) real without
storing every token id: a Mooncake prompt of 120k tokens is ~240 segments, not 120k integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.splitmix import mix64

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

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1, got {self.output_tokens}")
        if self.n < 1 or self.beam_width < 1:
            raise ValueError(f"request {self.request_id}: n and beam_width must be >= 1")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError(f"request {self.request_id}: parallel sampling and beam search are exclusive")
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
    return int(output_keys(np.array([request_id]), sample)[0])


def output_keys(request_ids: np.ndarray, samples: np.ndarray | int) -> np.ndarray:
    """`output_key` vectorized: uint64 keys of (request id, sample) pairs, the two arguments broadcast."""
    ids = np.asarray(request_ids, dtype=np.uint64)
    tags = np.asarray(samples, dtype=np.uint64) ^ np.uint64(1 << 62)
    return mix64((ids << np.uint64(20)) ^ tags) >> np.uint64(1)


def segment_token_ids(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The token at `offsets[i]` of the segment keyed `keys[i]`, int32 [S] (keys and offsets broadcast).
    The one definition of a segment's content: every other token-id function goes through it."""
    with np.errstate(over="ignore"):
        seed = np.asarray(keys, dtype=np.uint64) * np.uint64(0x100000001B3)
        return (mix64(np.asarray(offsets).astype(np.uint64) ^ seed) % np.uint64(VOCAB_SIZE)).astype(np.int32)


def token_ids_for(key: int, start: int, stop: int) -> np.ndarray:
    """Token ids at offsets [start, stop) of the segment with this key, int32."""
    return segment_token_ids(np.uint64(key & 0xFFFFFFFFFFFFFFFF), np.arange(start, stop, dtype=np.uint64))


def content_token_ids(content: tuple[Segment, ...]) -> np.ndarray:
    """Concatenated token ids of a content tuple, int32 [sum of lengths]."""
    if not content:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate([token_ids_for(s.key, 0, s.length) for s in content])
