"""The table's rows: the paper's value from values.yaml beside the workbench's, read from sweep summaries.

Each section function takes its entry of values.yaml and the summary table of its experiment (one
row per point, workbench.sweep.summary) and returns `Row`s. Paper numbers come only from the YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

VALUES_PATH = Path(__file__).with_name("values.yaml")


@dataclass(frozen=True)
class Row:
    figure: str  # the paper's figure or section
    item: str  # what is compared
    paper: str  # the paper's value as printed
    workbench: float
    diff: str  # workbench - paper (or the side of the range it falls on)
    ok: bool  # within the tolerance, or inside the stated range
    tolerance: str
    experiment: str  # experiments/<file>
    reason: str  # the explanation of the gap; empty when ok


def load_values(path: Path = VALUES_PATH) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _cite_short(entry: dict) -> str:
    return entry["cite"].split(" (")[0]


def _gap(entry: dict, key: str) -> str:
    gaps = entry.get("gap", {})
    return " ".join(gaps.get(key, gaps.get("default", "")).split())


def _point(table: pd.DataFrame, **where) -> pd.Series:
    """The one summary row whose columns equal `where`."""
    mask = pd.Series(True, index=table.index)
    for key, value in where.items():
        mask &= table[key] == value
    hits = table[mask]
    if len(hits) != 1:
        raise ValueError(f"expected one point with {where}, found {len(hits)}")
    return hits.iloc[0]


def _abs_row(entry, item, key, paper: float, ours: float, tol: float, unit: str) -> Row:
    ok = abs(ours - paper) <= tol
    points = " pp" if unit == "%" else unit  # a difference of percentages is in percentage points
    return Row(_cite_short(entry), item, f"{paper:g}{unit}", ours, f"{ours - paper:+.1f}{points}", ok,
               f"±{tol:g}{points}", entry["experiment"], "" if ok else _gap(entry, key))


def _rel_row(entry, item, key, paper: float, ours: float, tol_frac: float) -> Row:
    ok = abs(ours - paper) <= tol_frac * abs(paper)
    return Row(_cite_short(entry), item, f"{paper:g}", ours, f"{(ours - paper) / paper:+.0%}", ok,
               f"±{tol_frac:.0%}", entry["experiment"], "" if ok else _gap(entry, key))


def _range_row(entry, item, key, spec: dict, ours: float) -> Row:
    lo, hi = (float(v) for v in spec["range"])
    ok = lo <= ours <= hi
    side = "inside" if ok else ("below" if ours < lo else "above")
    return Row(_cite_short(entry), item, str(spec["paper"]), ours, side, ok, f"in [{lo:g}, {hi:g}]",
               entry["experiment"], "" if ok else _gap(entry, key))


# Fig. 2 segments: the paper's bar -> the workbench's saturated-window fractions (DESIGN §3)
FIG2_SEGMENTS = {
    "token": ("mem_token_frac_sat",),
    "reserved": ("mem_reserved_frac_sat",),
    "internal": ("mem_internal_frag_frac_sat",),
    "external": ("mem_external_frag_frac_sat", "mem_free_frac_sat", "mem_cached_frac_sat"),  # "& others"
    "frag": ("mem_internal_frag_frac_sat", "mem_external_frag_frac_sat", "mem_free_frac_sat", "mem_cached_frac_sat"),
}


def fig2(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    for strategy, segments in entry["rows"].items():
        point = _point(table, strategy=strategy)
        for segment, paper in segments.items():
            if segment == "waste":  # everything but token states
                ours = 100 * (1 - point["mem_token_frac_sat"])
            else:
                ours = 100 * sum(point[c] for c in FIG2_SEGMENTS[segment])
            rows.append(_abs_row(entry, f"{strategy}: {segment}", strategy, paper, ours, entry["tolerance"], "%"))
    return rows


def fig12(entry: dict, table: pd.DataFrame) -> list[Row]:
    """The rate a system sustains = its token throughput while a queue is present (Fig. 12's knee)."""
    tput = {s: _point(table, strategy=s)["throughput_tok_s_sat"] for s in ("paged", "contiguous-oracle",
                                                                           "contiguous-max")}
    ratios = {"paged_over_oracle": tput["paged"] / tput["contiguous-oracle"],
              "paged_over_max": tput["paged"] / tput["contiguous-max"]}
    return [_range_row(entry, key.replace("_", " "), key, spec, ratios[key]) for key, spec in entry["rows"].items()]


def fig13(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    for setting, systems in entry["rows"].items():
        workload_kind = "sharegpt" if setting.startswith("sharegpt") else "alpaca"
        sub = table[table["workload"].str.contains(workload_kind)]
        for strategy, paper in systems.items():
            ours = _point(sub, strategy=strategy)["mean_batch_size"]
            rows.append(_rel_row(entry, f"{setting}: {strategy}", f"{setting}/{strategy}", paper, ours,
                                 entry["tolerance_frac"]))
    return rows


def fig15(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    for key, paper in entry["rows"].items():
        mode, width = key.split("-")
        where = {"n": int(width), "beam_width": 1} if mode == "parallel" else {"n": 1, "beam_width": int(width)}
        ours = 100 * _point(table, **where)["block_sharing_saving_frac"]
        rows.append(_abs_row(entry, key, key, paper, ours, entry["tolerance"], "%"))
    return rows


def prefix(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    for key, paper in entry["rows"].items():
        prefix_tokens = key.rsplit("-", 1)[1]
        sub = table[table["workload"].str.contains(f"system={prefix_tokens},")]
        ratio = (_point(sub, strategy="paged-prefix")["throughput_tok_s_sat"]
                 / _point(sub, strategy="contiguous-oracle")["throughput_tok_s_sat"])
        rows.append(_rel_row(entry, f"{key}: paged-prefix / oracle", key, paper, ratio, entry["tolerance_frac"]))
    return rows


def best_block_sizes(table: pd.DataFrame, within_frac: float) -> list[int]:
    """Block sizes whose normalized latency is within `within_frac` of the best one."""
    lat = table.set_index("block_size")["normalized_latency_s_per_tok"]
    return sorted(int(b) for b in lat.index[lat <= lat.min() * (1 + within_frac)])


def fig18b(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    for key, spec in entry["rows"].items():
        sizes = best_block_sizes(table[table["workload"].str.contains(key)], entry["within_frac"])
        lo, hi = (float(v) for v in spec["range"])
        ok = lo <= sizes[0] and sizes[-1] <= hi
        best = table[table["workload"].str.contains(key)].set_index("block_size")["normalized_latency_s_per_tok"]
        rows.append(Row(_cite_short(entry), f"{key}: best block sizes", str(spec["paper"]), float(best.idxmin()),
                        f"{sizes[0]}-{sizes[-1]}", ok, f"within {entry['within_frac']:.0%} of best, in "
                        f"[{lo:g}, {hi:g}]", entry["experiment"], "" if ok else _gap(entry, key)))
    return rows


def fig19(entry: dict, table: pd.DataFrame) -> list[Row]:
    rows = []
    lat = table.pivot(index="block_size", columns="preemption", values="normalized_latency_s_per_tok")
    for key, spec in entry["rows"].items():
        ratio = float((lat["swap"] / lat["recompute"]).loc[spec["blocks"]].mean())
        rows.append(_range_row(entry, f"swap / recompute latency, blocks {spec['blocks'][0]}-{spec['blocks'][-1]}",
                               key, spec, ratio))
    return rows


SECTIONS = {"fig2": fig2, "fig12": fig12, "fig13": fig13, "fig15": fig15, "prefix": prefix, "fig18b": fig18b,
            "fig19": fig19}


def build_rows(values: dict[str, Any], tables: dict[str, pd.DataFrame]) -> list[Row]:
    """Every row, in the order of values.yaml; `tables` maps an experiment file name to its summary."""
    rows: list[Row] = []
    for section, entry in values.items():
        rows += SECTIONS[section](entry, tables[entry["experiment"]])
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| figure | quantity | paper | workbench | difference | tolerance | within | experiment |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        value = "nan" if math.isnan(r.workbench) else f"{r.workbench:.4g}"
        lines.append(f"| {r.figure} | {r.item} | {r.paper} | {value} | {r.diff} | {r.tolerance} | "
                     f"{'yes' if r.ok else 'no'} | `experiments/{r.experiment}` |")
    gaps = [r for r in rows if not r.ok]
    if gaps:
        lines += ["", "Outside the tolerance:", ""]
        lines += [f"- **{r.figure}, {r.item}**: {r.reason}" for r in gaps]
    return "\n".join(lines) + "\n"
