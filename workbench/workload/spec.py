"""The workload string of `--workload`: a synthetic name or a trace, each with optional parameters.

    NAME[:key=value,...]            synthetic, e.g. `fixed:prompt=128,output=128`
    FORMAT:PATH[:key=value,...]     trace, FORMAT in azure|burstgpt|mooncake|lengths; PATH is a file
                                    or a registry trace name, e.g. `burstgpt:burstgpt3-head400:failed=keep`
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workbench.errors import WorkloadError

TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "lengths")
SYNTHETIC_NAMES = ("sharegpt-like", "alpaca-like", "fixed", "system-prompt", "multi-turn")

MAX_TOKENS = 2**31 - 1
# Every numeric parameter's range, enforced in get_int / get_float: beyond them a parameter overflows or
# underflows what it feeds (cv: the gamma shape 1/cv^2 and scale; prompt: int64 token arrays; k: one
# content key per system prompt in memory) instead of describing a workload.
PARAM_RANGES = {
    "cv": (1e-3, 1e3),  # coefficient of variation of the arrival gaps: near-periodic to extremely bursty
    "think": (1e-6, 1e6),  # mean think time between turns, seconds
    "prompt": (1, MAX_TOKENS), "output": (1, MAX_TOKENS), "system": (1, MAX_TOKENS),  # tokens
    "k": (1, 1_000_000),  # system prompts
    "turns": (1, 1_000),  # turns per session (each turn's prompt holds the previous ones: quadratic work)
    "history": (1, MAX_TOKENS),  # tokens of conversation a multi-turn prompt keeps
}

_PARAMS = re.compile(r"^[a-z_]+=[^,=:]*(,[a-z_]+=[^,=:]*)*$")


@dataclass(frozen=True)
class WorkloadSpec:
    text: str  # as the user wrote it; errors name it as the "file"
    kind: str  # a synthetic name or a trace format
    params: dict[str, str] = field(default_factory=dict)
    path: str | None = None  # traces only

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.params:
            if key not in allowed:
                raise WorkloadError(self.text, None, key, f"a parameter of {self.kind}: {', '.join(allowed) or 'none'}")

    def get_int(self, key: str, default: int) -> int:
        """The integer parameter `key`, within its PARAM_RANGES bounds."""
        if key not in self.params:
            return default
        raw = self.params[key]
        low, high = PARAM_RANGES[key]
        if not re.fullmatch(r"-?\d{1,20}", raw.strip()) or not low <= int(raw) <= high:
            raise WorkloadError(self.text, None, key, f"an integer in [{low}, {high}]", raw)
        return int(raw)

    def get_float(self, key: str, default: float) -> float:
        """The number parameter `key`, within its PARAM_RANGES bounds."""
        if key not in self.params:
            return default
        raw = self.params[key]
        low, high = PARAM_RANGES[key]
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:  # NaN fails too
            raise WorkloadError(self.text, None, key, f"a number in [{low:g}, {high:g}]", raw)
        return value

    def get_choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.params.get(key, default)
        if value not in choices:
            raise WorkloadError(self.text, None, key, f"one of {', '.join(choices)}", value)
        return value


def parse_spec(text: str) -> WorkloadSpec:
    head, _, rest = text.partition(":")
    if head in TRACE_FORMATS:
        path, params = rest, {}
        before, sep, last = rest.rpartition(":")
        if sep and before and _PARAMS.match(last):
            path, params = before, _parse_params(text, last)
        if not path:
            raise WorkloadError(text, None, "workload", f"{head}:PATH with PATH a trace file or registry name")
        return WorkloadSpec(text, head, params, path)
    if head in SYNTHETIC_NAMES:
        return WorkloadSpec(text, head, _parse_params(text, rest) if rest else {})
    raise WorkloadError(text, None, "workload", f"a synthetic name ({', '.join(SYNTHETIC_NAMES)}) or FORMAT:PATH "
                        f"with FORMAT one of {', '.join(TRACE_FORMATS)}", head)


def _parse_params(text: str, raw: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise WorkloadError(text, None, "workload", "parameters written key=value,key=value", item)
        if key in params:
            raise WorkloadError(text, None, key, "each parameter once")
        params[key] = value.strip()
    return params
