"""The paper table as a reader sees it: the counts by kind, the headline and the markdown of the rows
(workbench.paper.rows builds them)."""

from __future__ import annotations

import math
from typing import Any

from workbench.paper.row import (
    DERIVED,
    KINDS,
    NOT_GRADED,
    PEER_KINDS,
    PREDICTION,
    UNGRADED,
    Row,
    cite_short,
    not_graded_claims,
)


def counts_by_kind(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """(rows counted within their band, rows) for each kind that grades, in KINDS order; a seed-sensitive
    row is never counted within."""
    return {kind: (sum(r.within for r in rows if r.kind == kind), sum(r.kind == kind for r in rows))
            for kind in KINDS if kind not in NOT_GRADED and any(r.kind == kind for r in rows)}


def headline(rows: list[Row]) -> str:
    counts = counts_by_kind(rows)
    within, total = counts.get(PREDICTION, (0, 0))
    sensitive = sum(r.seed_sensitive for r in rows if r.kind == PREDICTION)
    others = "; ".join(f"{kind}: {k} of {n}" for kind, (k, n) in counts.items()
                       if kind != PREDICTION and kind not in PEER_KINDS)
    ungraded = {kind: sum(r.kind == kind for r in rows) for kind in NOT_GRADED}
    peer = "; ".join(f"{kind}s: {k} of {n} row counts" for kind, (k, n) in counts.items() if kind in PEER_KINDS)
    text = (f"Paper predictions: {within} of {total} within their band ({sensitive} seed-sensitive, not "
            f"counted within). Not predictions, so not counted: {others}; {ungraded[UNGRADED]} rows not graded "
            f"(no verified paper value); {ungraded[DERIVED]} derived rows (the workbench's own definitions "
            f"beside the artifact's), not graded.")
    if peer:
        text += f" Peer check, Vidur's profiled operators (not the paper), within their band: {peer}."
    return text


def _value(r: Row) -> str:
    value = "nan" if math.isnan(r.workbench) else f"{r.workbench:.4g}"
    if r.seed_values:
        value += f" ({min(r.seed_values):.4g} to {max(r.seed_values):.4g} over {len(r.seed_values)} seeds)"
    return value


def _verdict(r: Row) -> str:
    if r.kind in NOT_GRADED:
        return "(not graded)"
    if r.seed_sensitive:
        return "seed-sensitive: " + ", ".join("yes" if ok else "no" for ok in r.seed_oks)
    return "yes" if r.ok else "no"


def _table(rows: list[Row]) -> list[str]:
    lines = ["| figure | quantity | kind | paper | workbench | difference | band | within | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.figure} | {r.item} | {r.kind} | {r.paper} | {_value(r)} | {r.diff} | {r.tolerance} | "
              f"{_verdict(r)} | `{r.experiment}` |" for r in rows if r.listed]
    return lines


def _peer_lines(rows: list[Row]) -> list[str]:
    """Per GPU and model: the row counts within the band and, outside it, their spread and the worst."""
    lines = []
    for pair in dict.fromkeys(r.item.split(",")[0] for r in rows):
        mine = [r for r in rows if r.item.split(",")[0] == pair]
        text = f"- **{pair}** ({mine[0].kind}): {sum(r.ok for r in mine)} of {len(mine)} row counts within their band"
        outside = sorted(((r.workbench - float(r.paper)) / float(r.paper), r.item) for r in mine if not r.ok)
        if outside:
            worst = max(outside, key=lambda pair_diff: abs(pair_diff[0]))
            text += (f"; the other {len(outside)} from {outside[0][0]:+.0%} to {outside[-1][0]:+.0%}, the worst "
                     f"at {worst[1].split(', ')[1].split(':')[0]} ({worst[0]:+.0%})")
        lines.append(text)
    return lines


def markdown(rows: list[Row], values: dict[str, Any] | None = None) -> str:
    paper_rows = [r for r in rows if r.kind not in PEER_KINDS]
    peer_rows = [r for r in rows if r.kind in PEER_KINDS]
    lines = _table(paper_rows)
    gaps = [r for r in paper_rows if not r.within and r.kind not in NOT_GRADED]
    if gaps:
        lines += ["", "Outside the band, or seed-sensitive:", ""]
        lines += [f"- **{r.figure}, {r.item}** ({r.kind}): {r.reason}" for r in gaps]
    ungraded = [r for r in paper_rows if r.kind == UNGRADED]
    if ungraded:
        lines += ["", "Not graded, shown:", ""]
        lines += [f"- **{r.figure}, {r.item}**: {r.reason}" for r in ungraded]
    derived = [r for r in paper_rows if r.kind == DERIVED]
    if derived:
        reasons = dict.fromkeys(f"- **{r.figure}**: {r.reason}" for r in derived)
        lines += ["", "Derived rows:", "", *reasons]
    claims = not_graded_claims() if values is not None else []
    if claims:
        lines += ["", "Not graded, not run:", ""]
        lines += [f"- **{claim['cite']}**: {' '.join(claim['reason'].split())}" for claim in claims]
    if values is not None:
        lines += ["", "Where each band comes from (its source, then why):", ""]
        lines += [f"- **{cite_short(entry)}**: {entry['band_source']}; {entry['band']}"
                  for entry in values.values() if entry["kind"] not in PEER_KINDS]
    if peer_rows:
        counts = counts_by_kind(peer_rows)
        lines += ["", "## Peer check: Vidur's profiled operators", "",
                  "Not the paper: a layer of the clock's operators beside Vidur's profiled ones (Agrawal et al., "
                  "MLSys 2024) at every profiled row count from 1 to 4,096; "
                  + "; ".join(f"{kind}s: {k} of {n} row counts within their band" for kind, (k, n) in counts.items())
                  + ". The anchor rows:", "", *_table(peer_rows), "", *_peer_lines(peer_rows)]
        gaps = [r for r in peer_rows if r.listed and not r.ok]
        lines += ["", "Outside the band:", ""] if gaps else []
        lines += [f"- **{r.figure}, {r.item}** ({r.kind}): {r.reason}" for r in gaps]
        if values is not None:
            lines += ["", *[f"Band: {entry['band_source']}; {entry['band']}" for entry in values.values()
                            if entry["kind"] in PEER_KINDS]]
    return "\n".join(lines) + "\n"
