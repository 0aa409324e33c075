"""Synthetic workloads (docs/workloads.md). Every generator draws from one `np.random.default_rng(seed)` in a
fixed order, so a config and a seed fix the workload. Arrivals: gamma gaps with mean 1/rate and
coefficient of variation `cv` (default 1 = Poisson); every name takes `cv=...`.

- `sharegpt-like`, `alpaca-like`: lengths from `distributions.LENGTH_DISTS` (lognormals fitted to the
  real files' medians and the paper's means), one unique prompt segment per request.
- `fixed:prompt=P,output=O`: every request P prompt and O output tokens (defaults 128, 128).
- `system-prompt:k=K,system=L,lengths=alpaca|sharegpt`: K shared system prompts of L tokens (defaults
  4, 512); each request picks one uniformly and appends a unique user part; user part and output
  lengths follow `lengths` (default alpaca) with the total kept within max_model_len.
- `multi-turn:turns=T,think=S,lengths=alpaca|sharegpt`: sessions of up to T turns (default 4) start at
  rate/T per second, so requests arrive at about `rate`; turn t+1 arrives an exponential think time
  (mean S s, default 10) after turn t and its prompt is turn t's prompt, turn t's answer
  (`Segment(output_key of turn t, its output_tokens)`) and a new user part. A session ends early at
  the first turn whose prompt + output would exceed max_model_len. With `history=H` a chatbot client
  keeps only the conversation's last H tokens (the vLLM paper's chatbot, §6.5: H = 1024): a longer
  prompt is cut from the front, so it shares no leading block with an earlier turn and is one new
  segment, and outputs are capped at max_model_len - H, so that every turn fits and sessions run all
  T turns.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import WorkloadError
from workbench.workload import distributions
from workbench.workload.distributions import LENGTH_DISTS, LengthDist, arrival_times_s
from workbench.workload.request import Segment
from workbench.workload.spec import WorkloadSpec
from workbench.workload.table import OutputRef, Part, RequestTable, content_keys

DEFAULT_NUM_REQUESTS = 1000
DEFAULT_RATE = 1.0  # requests/s when --rate is not given


def generate(
    spec: WorkloadSpec, *, seed: int, rate: float | None, num_requests: int | None, duration_s: float | None,
    max_model_len: int,
) -> RequestTable:
    """The synthetic workload named by `spec`: `num_requests` requests, or (when None) every arrival before
    `duration_s`; `table.finalize` then applies the cap and the window."""
    rng = np.random.default_rng(seed)
    rate = DEFAULT_RATE if rate is None else rate
    if spec.kind == "multi-turn":
        spec.check_keys(("cv", "turns", "think", "lengths", "history"))
        return _multi_turn(spec, rng, seed, rate, num_requests, duration_s, max_model_len)
    allowed = {"sharegpt-like": ("cv",), "alpaca-like": ("cv",), "fixed": ("cv", "prompt", "output"),
               "system-prompt": ("cv", "k", "system", "lengths")}[spec.kind]
    spec.check_keys(allowed)
    arrival_s = arrival_times_s(rng, rate, spec.get_float("cv", 1.0), num=num_requests, duration_s=duration_s)
    count = len(arrival_s)
    if spec.kind == "fixed":
        prompt = np.full(count, spec.get_int("prompt", 128), dtype=np.int64)
        output = np.full(count, spec.get_int("output", 128), dtype=np.int64)
        return RequestTable(arrival_s, prompt, output)
    if spec.kind in ("sharegpt-like", "alpaca-like"):
        prompt, output = sample_lengths(spec, LENGTH_DISTS[spec.kind.removesuffix("-like")], count, rng,
                                        max_model_len)
        return RequestTable(arrival_s, prompt, output)
    return _system_prompt(spec, rng, seed, arrival_s, max_model_len)


def sample_lengths(spec: WorkloadSpec, dist: LengthDist, num: int, rng: np.random.Generator,
                   limit_tokens: int) -> tuple[np.ndarray, ...]:
    """`distributions.sample_lengths`, with a limit too short for the distribution named as a workload error."""
    try:
        return distributions.sample_lengths(dist, num, rng, limit_tokens)
    except ValueError as exc:
        raise WorkloadError(spec.text, None, "max_model_len", f"a longer limit: {exc}") from None


def _lengths_dist(spec: WorkloadSpec) -> LengthDist:
    return LENGTH_DISTS[spec.get_choice("lengths", "alpaca", tuple(LENGTH_DISTS))]


def _system_prompt(spec: WorkloadSpec, rng: np.random.Generator, seed: int, arrival_s: np.ndarray,
                   max_model_len: int) -> RequestTable:
    k = spec.get_int("k", 4)
    system_tokens = spec.get_int("system", 512)
    if system_tokens + 2 > max_model_len:
        raise WorkloadError(spec.text, None, "system", f"at most max_model_len - 2 = {max_model_len - 2} tokens",
                            system_tokens)
    count = len(arrival_s)
    user, output = sample_lengths(spec, _lengths_dist(spec), count, rng, max_model_len - system_tokens)
    choice = rng.integers(0, k, size=count)  # [count] which system prompt each request uses
    system_keys = content_keys(f"system/{seed}", np.arange(k)).tolist()
    user_keys = content_keys(f"user/{seed}", np.arange(count)).tolist()
    content: list[tuple[Part, ...]] = [
        (Segment(system_keys[c], system_tokens), Segment(user_keys[i], int(user[i])))
        for i, c in enumerate(choice.tolist())
    ]
    return RequestTable(arrival_s, system_tokens + user, output, content)


def _multi_turn(spec: WorkloadSpec, rng: np.random.Generator, seed: int, rate: float, num: int | None,
                duration_s: float | None, max_model_len: int) -> RequestTable:
    turns = spec.get_int("turns", 4)
    think_s = spec.get_float("think", 10.0)
    cv = spec.get_float("cv", 1.0)
    history = spec.get_int("history", 0) or None  # not given (0 is out of its range): prompts keep it all
    if history is not None and history >= max_model_len:
        raise WorkloadError(spec.text, None, "history", f"fewer tokens than max_model_len ({max_model_len})", history)
    dist = _lengths_dist(spec)
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    content: list[tuple[Part, ...]] = []
    sessions: list[str | None] = []
    start_s = 0.0
    num_sessions = 0
    while (len(arrivals) < num) if num is not None else (start_s < duration_s):
        session_starts = start_s + arrival_times_s(rng, rate / turns, cv, num=64)
        user, output = sample_lengths(spec, dist, 64 * turns, rng, max_model_len)
        if history is not None:
            output = np.minimum(output, max_model_len - history)
        think = rng.exponential(think_s, size=64 * turns)
        first_row = len(arrivals)
        user_keys = content_keys(f"turn/{seed}", np.arange(first_row, first_row + 64 * turns)).tolist()
        if history is not None:
            cut_keys = content_keys(f"history/{seed}", np.arange(first_row, first_row + 64 * turns)).tolist()
        for s, t_s in enumerate(session_starts.tolist()):
            context: list[Part] = []
            context_tokens = 0
            for turn in range(turns):
                u, o = int(user[s * turns + turn]), int(output[s * turns + turn])
                prompt = context_tokens + u if history is None else min(context_tokens + u, history)
                if prompt + o > max_model_len:
                    break
                row = len(arrivals)
                user_part = Segment(user_keys[row - first_row], u)
                arrivals.append(t_s)
                prompts.append(prompt)
                outputs.append(o)
                # a prompt cut from the front starts with none of the earlier turn's tokens: one new segment
                cut = prompt < context_tokens + u
                content.append((Segment(cut_keys[row - first_row], prompt),) if cut else (*context, user_part))
                sessions.append(f"session-{num_sessions}")
                context += [user_part, OutputRef(row, o)]
                context_tokens += u + o
                t_s += float(think[s * turns + turn])
            num_sessions += 1
        # the next batch of sessions continues the same arrival process after the last start
        start_s = float(session_starts[-1]) + float(rng.gamma(1 / cv**2, cv**2 * turns / rate))
    return RequestTable(np.array(arrivals), np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64),
                        content, sessions)
