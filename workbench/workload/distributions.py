"""Random arrival processes and length distributions for synthetic workloads (all driven by one seeded rng).

Length distributions are independent lognormals for prompt and output tokens, rounded to integers
(at least 1) and truncated jointly to prompt + output <= 2048 (the OPT context the vLLM paper filtered
its datasets to) or a smaller limit. Parameters were fitted so that the *truncated* distribution
matches the median of the real length file under ../shared/traces and the mean the vLLM paper
reports (docs/workloads.md); a lognormal fitted to the log-moments instead undershoots the ShareGPT prompt
mean by a quarter, because the real prompts are heavier-tailed than a lognormal:

| name        | prompt mu, sigma | output mu, sigma | target prompt median / mean | output median / mean |
|-------------|------------------|------------------|-----------------------------|----------------------|
| sharegpt    | 3.800, 2.538     | 5.608, 0.686     | 35 / 161.31                 | 271 / 337.99         |
| alpaca      | 2.652, 0.790     | 3.784, 0.753     | 14 / 19.31                  | 44 / 58.45           |

(ShareGPT: sharegpt-vllm-sosp23-lengths filtered to input+output <= 2048, 79,731 rows; Alpaca: the
alpaca-5000-subset GPT-2-BPE lengths, whose prompts lack the template, so the paper's mean is used.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PAPER_CONTEXT_TOKENS = 2048
MAX_DRAWS_PER_REQUEST = 10_000  # rejection sampling beyond this is refused rather than left to spin


@dataclass(frozen=True)
class LengthDist:
    name: str
    prompt_mu: float
    prompt_sigma: float
    output_mu: float
    output_sigma: float


LENGTH_DISTS = {
    "sharegpt": LengthDist("sharegpt", 3.800, 2.538, 5.608, 0.686),
    "alpaca": LengthDist("alpaca", 2.652, 0.790, 3.784, 0.753),
}


def sample_lengths(dist: LengthDist, num: int, rng: np.random.Generator, limit_tokens: int) -> tuple[np.ndarray, ...]:
    """(prompt_tokens, output_tokens), int64 [num] each, with prompt + output <= min(limit_tokens, 2048).

    Rejection sampling in batches; draws from `rng` (mutated) in a fixed order, so a seed fixes the result.
    """
    limit = min(limit_tokens, PAPER_CONTEXT_TOKENS)
    check_limit(dist, limit_tokens)
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    have = 0
    while have < num:
        batch = max(2 * (num - have), 1024)
        prompt = _rounded_lognormal(rng, dist.prompt_mu, dist.prompt_sigma, batch, limit)
        output = _rounded_lognormal(rng, dist.output_mu, dist.output_sigma, batch, limit)
        ok = prompt + output <= limit
        prompts.append(prompt[ok])
        outputs.append(output[ok])
        have += int(ok.sum())
    return np.concatenate(prompts)[:num].astype(np.int64), np.concatenate(outputs)[:num].astype(np.int64)


_DRAW_CHUNK = 1 << 16


def _rounded_lognormal(rng: np.random.Generator, mu: float, sigma: float, num: int, limit: int) -> np.ndarray:
    """max(1, rint(x)) of `num` lognormal draws, uint16 [num], a draw above `limit` + 1 kept as `limit` + 1
    (it is rejected either way). The same draws as one call for all `num` (the generator's stream does not
    depend on how it is split), made in chunks: a million-request workload never holds its candidates as
    float64."""
    out = np.empty(num, dtype=np.uint16)
    cap = float(limit + 1)
    for start in range(0, num, _DRAW_CHUNK):
        x = rng.lognormal(mu, sigma, min(_DRAW_CHUNK, num - start))
        out[start:start + x.shape[0]] = np.maximum(1.0, np.rint(np.minimum(x, cap)))
    return out


def fit_probability_bound(dist: LengthDist, limit_tokens: int) -> float:
    """An upper bound on the chance that one draw has prompt + output <= limit_tokens: both parts must
    be <= limit - 1 on their own (independent lognormals, rounded to integers >= 1)."""
    limit = min(limit_tokens, PAPER_CONTEXT_TOKENS)
    if limit < 2:
        return 0.0

    def below(mu: float, sigma: float) -> float:  # P(max(1, rint(X)) <= limit - 1), X lognormal
        z = (math.log(limit - 0.5) - mu) / sigma
        return 0.5 * math.erfc(-z / math.sqrt(2))

    return below(dist.prompt_mu, dist.prompt_sigma) * below(dist.output_mu, dist.output_sigma)


def check_limit(dist: LengthDist, limit_tokens: int) -> None:
    """Raise ValueError when rejection sampling under `limit_tokens` would need more than
    MAX_DRAWS_PER_REQUEST draws per request (it would all but hang), naming the smallest limit that works."""
    if fit_probability_bound(dist, limit_tokens) * MAX_DRAWS_PER_REQUEST >= 1:
        return
    smallest = next(n for n in range(2, PAPER_CONTEXT_TOKENS + 1)
                    if fit_probability_bound(dist, n) * MAX_DRAWS_PER_REQUEST >= 1)
    raise ValueError(f"a length limit of {limit_tokens} tokens fits fewer than 1 in {MAX_DRAWS_PER_REQUEST:,} "
                     f"draws of the {dist.name} lengths; it needs at least {smallest} tokens")


def arrival_times_s(
    rng: np.random.Generator, rate: float, cv: float, *, num: int | None = None, duration_s: float | None = None
) -> np.ndarray:
    """Arrival times in seconds, float64: the first at 0, then i.i.d. gamma gaps with mean 1/rate and
    coefficient of variation `cv` (cv = 1 is exponential, i.e. a Poisson process; cv > 1 is bursty).

    Exactly `num` arrivals when given; otherwise every arrival before `duration_s`. Mutates `rng`.
    """
    if not rate > 0 or not cv > 0:
        raise ValueError(f"rate and cv must be > 0, got rate={rate}, cv={cv}")
    shape = 1.0 / cv**2
    scale = 1.0 / (rate * shape)
    if num is not None:
        times = np.zeros(max(num, 1))
        np.cumsum(rng.gamma(shape, scale, max(num - 1, 0)), out=times[1:])
        return times[:num]
    if duration_s is None:
        raise ValueError("give num or duration_s")
    chunks = [np.zeros(1)]
    last_s = 0.0
    while last_s < duration_s:
        gaps = rng.gamma(shape, scale, max(int(rate * (duration_s - last_s) * 1.1) + 16, 16))
        chunk = last_s + np.cumsum(gaps)
        chunks.append(chunk)
        last_s = float(chunk[-1])
    times = np.concatenate(chunks)
    return times[times < duration_s]
