"""The scheduler stays readable in one sitting: `scheduler.py` at most 300 lines and `Scheduler.schedule` at most
45. Its steps live in their own objects (admission, arrivals, residency, the decode batch, prefill chunks); a
change that grows the scheduler past either limit moves a step out instead."""

from __future__ import annotations

import ast
from pathlib import Path

SCHEDULER = Path(__file__).parents[2] / "workbench" / "engine" / "scheduler.py"
MAX_FILE_LINES = 300
MAX_SCHEDULE_LINES = 45


def test_scheduler_module_and_schedule_stay_within_their_line_limits():
    source = SCHEDULER.read_text()
    assert len(source.splitlines()) <= MAX_FILE_LINES
    (schedule,) = [node for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.FunctionDef) and node.name == "schedule"]
    assert schedule.end_lineno - schedule.lineno + 1 <= MAX_SCHEDULE_LINES
