"""workbench.engine.rules, and the step cost's `query_keys`, compiled with Numba for the compiled step loop
(workbench.engine.compiled_paged).

Each is the rule itself (`rules.f` is `compiled_rules.f.py_func`), compiled where a compiled loop calls it:
the verdicts are stated once, in `rules`, and Python callers call them there.
"""

from __future__ import annotations

from numba import njit

from workbench.clock import step_cost
from workbench.engine import rules
from workbench.engine.rules import BELOW_WATERMARK, IDLE, PLACE, RUN, STOP, STUCK  # noqa: F401  (the loop's codes)

next_event_s = njit(cache=True)(rules.next_event_s)
too_long = njit(cache=True)(rules.too_long)
final_kv_len = njit(cache=True)(rules.final_kv_len)
recompute_tokens = njit(cache=True)(rules.recompute_tokens)
blocks_needed = njit(cache=True)(rules.blocks_needed)
admission_verdict = njit(cache=True)(rules.admission_verdict)
admits_now = njit(cache=True)(rules.admits_now)
refusal_is_final = njit(cache=True)(rules.refusal_is_final)
retires_victim = njit(cache=True)(rules.retires_victim)
admits_after = njit(cache=True)(rules.admits_after)
victim = njit(cache=True)(rules.victim)
tokens_left = njit(cache=True)(rules.tokens_left)
step_verdict = njit(cache=True)(rules.step_verdict)
first_time = njit(cache=True)(rules.first_time)
query_keys = njit(cache=True)(step_cost.query_keys)
