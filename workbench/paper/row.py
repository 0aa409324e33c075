"""What a row of the paper table is: its kinds of test, the `Row` itself, and the paper's values it is read
against (values.yaml), loaded and checked.

Every row says what kind of test it is (`KINDS`); the headline counts the paper's predictions only, the
peer's rows apart (workbench.paper.report).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

VALUES_PATH = Path(__file__).with_name("values.yaml")

PREDICTION = "prediction"
FIT_TARGET = "fit target"
SAME_PANEL = "in a fitted panel"
SIBLING = "fitted on a sibling panel"
CHOSEN = "configuration chosen by this row"
DEFINITION = "fixed by definition"
SPLIT = "part of a scored sum"
INPUT = "input data"
SUMMARY = "summary of rows above"
UNGRADED = "not graded"
DERIVED = "derived"
PEER_PREDICTION = "peer prediction"
PEER_FIT_TARGET = "peer fit target"
# values.yaml explains each; the last two are Vidur's (a peer simulator's profiled operators, not the paper)
KINDS = (PREDICTION, FIT_TARGET, SAME_PANEL, SIBLING, CHOSEN, DEFINITION, SPLIT, INPUT, SUMMARY, UNGRADED,
         DERIVED, PEER_PREDICTION, PEER_FIT_TARGET)
NOT_GRADED = (UNGRADED, DERIVED)  # shown, never graded
PEER_KINDS = (PEER_PREDICTION, PEER_FIT_TARGET)
# the sources a band may name (values.yaml `band_source`)
BAND_SOURCES = ("reading precision", "printed precision", "the text", "the peer's accuracy", "judgment")


@dataclass(frozen=True)
class Row:
    figure: str  # the paper's figure or section
    item: str  # what is compared
    kind: str  # one of KINDS
    paper: str  # the paper's value as printed
    workbench: float
    diff: str  # workbench - paper (or the side of the range it falls on)
    ok: bool  # within the band (a derived row is not graded: its `ok` says only how it compares)
    tolerance: str  # the band
    experiment: str  # experiments/<file>, or the module that computes a clock-only row
    reason: str  # the explanation of the gap; empty when ok
    listed: bool = True  # shown as a line of the table (a peer row at a row count between anchors is only counted)
    seed_values: tuple[float, ...] = ()  # the value at each seed, when the experiment ran more than one
    seed_oks: tuple[bool, ...] = ()  # the verdict at each seed
    # the same row for another value (the median over seeds), graded against the same band
    remake: Callable[[float], Row] | None = field(default=None, compare=False, repr=False)

    @property
    def seed_sensitive(self) -> bool:
        return len(set(self.seed_oks)) > 1

    @property
    def within(self) -> bool:
        """Counted within its band: inside it at the median and at every seed."""
        return self.ok and not self.seed_sensitive


NOT_GRADED_KEY = "not_graded"  # values.yaml's list of the paper's claims the table does not grade, with reasons


def load_values(path: Path = VALUES_PATH) -> dict[str, Any]:
    """The sections of values.yaml (its `not_graded` list apart: `not_graded_claims`)."""
    values = yaml.safe_load(path.read_text())
    values.pop(NOT_GRADED_KEY, None)
    for section, entry in values.items():
        if entry.get("band_source") not in BAND_SOURCES:
            raise ValueError(f"{path}: {section}: band_source {entry.get('band_source')!r} is not one of "
                             f"{', '.join(BAND_SOURCES)}")
        kinds = [entry["kind"], *entry.get("kinds", {}).values()]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"{path}: {section}: kind {unknown[0]!r} is not one of {', '.join(KINDS)}")
    return values


def not_graded_claims(path: Path = VALUES_PATH) -> list[dict[str, str]]:
    """The paper's claims the table leaves ungraded, each with its `cite` and `reason`."""
    return yaml.safe_load(path.read_text()).get(NOT_GRADED_KEY, [])


def cite_short(entry: dict) -> str:
    return entry["cite"].split(" (")[0]

