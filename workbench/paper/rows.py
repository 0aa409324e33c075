"""The table's rows: the paper's value from values.yaml beside the workbench's, read from sweep summaries.

Each section function takes its entry of values.yaml, the summary table of its experiment (one row
per point, workbench.sweep.summary) and the directory of its points (for the sections that read a
point's step and request tables), and returns `Row`s. Paper numbers come only from the YAML, and the
peer's (Vidur's profiled operator times) from its published data (workbench/paper/data). Every
row says what kind of test it is (`KINDS`); the headline counts predictions only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from workbench.config import RunConfig
from workbench.paper import artifact, micro, vidur

VALUES_PATH = Path(__file__).with_name("values.yaml")

PREDICTION = "prediction"
FIT_TARGET = "fit target"
SIBLING = "fitted on a sibling panel"
CHOSEN = "configuration chosen by this row"
DERIVED = "derived"
KINDS = (PREDICTION, FIT_TARGET, SIBLING, CHOSEN, DERIVED)  # values.yaml explains each


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


def load_values(path: Path = VALUES_PATH) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text())
    for section, entry in values.items():
        kinds = [entry["kind"], *entry.get("kinds", {}).values()]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"{path}: {section}: kind {unknown[0]!r} is not one of {', '.join(KINDS)}")
    return values


def _cite_short(entry: dict) -> str:
    return entry["cite"].split(" (")[0]


def _kind(entry: dict, key: str) -> str:
    return entry.get("kinds", {}).get(key, entry["kind"])


def _source(entry: dict) -> str:
    return NO_RUN_SOURCES.get(entry["experiment"], f"experiments/{entry['experiment']}")


def _gap(entry: dict, key: str) -> str:
    """The explanation for row `key`: its own, else its family's (`parallel` for `parallel-2`), else the default."""
    gaps = entry.get("gap", {})
    text = gaps.get(key, gaps.get(key.split("-")[0], gaps.get("default", "")))
    return " ".join(text.split())


def _point(table: pd.DataFrame, **where) -> pd.Series:
    """The one summary row whose columns equal `where`."""
    mask = pd.Series(True, index=table.index)
    for key, value in where.items():
        mask &= table[key] == value
    hits = table[mask]
    if len(hits) != 1:
        raise ValueError(f"expected one point with {where}, found {len(hits)}")
    return hits.iloc[0]


def _abs_row(entry, item, key, paper: float, ours: float, tol: float, unit: str, kind: str | None = None) -> Row:
    ok = abs(ours - paper) <= tol
    points = " pp" if unit == "%" else unit  # a difference of percentages is in percentage points
    return Row(_cite_short(entry), item, kind or _kind(entry, key), f"{paper:g}{unit}", ours,
               f"{ours - paper:+.1f}{points}", ok, f"±{tol:g}{points}", _source(entry),
               "" if ok else _gap(entry, key))


def _sustained_ratio(table: pd.DataFrame, strategy: str, baseline: str) -> float:
    """The rate `strategy` sustains over `baseline`'s on one workload: their token throughputs while a queue
    is present (the knee of a latency-vs-rate curve)."""
    return (_point(table, strategy=strategy)["throughput_tok_s_sat"]
            / _point(table, strategy=baseline)["throughput_tok_s_sat"])


def _rel_row(entry, item, key, paper: float, ours: float, tol_frac: float, kind: str | None = None) -> Row:
    ok = abs(ours - paper) <= tol_frac * abs(paper)
    return Row(_cite_short(entry), item, kind or _kind(entry, key), f"{paper:g}", ours,
               f"{(ours - paper) / paper:+.0%}", ok, f"±{tol_frac:.0%}", _source(entry),
               "" if ok else _gap(entry, key))


def _range_row(entry, item, key, spec: dict, ours: float) -> Row:
    lo, hi = (float(v) for v in spec["range"])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{_cite_short(entry)}, {key}: a band must be two-sided, not [{lo}, {hi}]")
    ok = lo <= ours <= hi
    side = "inside" if ok else ("below" if ours < lo else "above")
    return Row(_cite_short(entry), item, _kind(entry, key), str(spec["paper"]), ours, side, ok,
               f"in [{lo:g}, {hi:g}]", _source(entry), "" if ok else _gap(entry, key))


def _derived(entry: dict, row: Row) -> Row:
    """A derived row always carries the section's explanation of the two definitions."""
    return dataclasses.replace(row, reason=_gap(entry, "derived"))


def _points_dir(points_dir: Path | None, section: str) -> Path:
    if points_dir is None:
        raise ValueError(f"{section}: needs the experiment's points directory (its step and request tables)")
    return points_dir


def _point_tables(points_dir: Path, point: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = points_dir / point["point_id"]
    return pd.read_parquet(folder / "steps.parquet"), pd.read_parquet(folder / "requests.parquet")


def table1(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    """The KV slots a model's server holds, from the GPUs' memory (`--tp` of them), its weights and the
    utilization: `RunConfig.resolve()` with no `--kv-gib`."""
    rows = []
    for model, spec in entry["rows"].items():
        ours = RunConfig(model=model, gpu=spec["gpu"], tp=spec["tp"]).resolve().capacity_slots
        gpus = f"{spec['tp']} × {spec['gpu']}" if spec["tp"] > 1 else spec["gpu"]
        rows.append(_rel_row(entry, f"{model} on {gpus}: KV slots", model, spec["slots"], ours,
                             entry["tolerance_frac"]))
    return rows


# Fig. 2 segments: the paper's bar -> the workbench's saturated-window fractions (docs/memory.md)
FIG2_SEGMENTS = {
    "token": ("mem_token_frac_sat",),
    "reserved": ("mem_reserved_frac_sat",),
    "internal": ("mem_internal_frag_frac_sat",),
    "external": ("mem_external_frag_frac_sat", "mem_free_frac_sat", "mem_cached_frac_sat"),  # "& others"
}


def fig2(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """Token and reservation shares as the workbench counts them (the artifact counts them alike);
    internal and external under the artifact's accounting (graded) and the workbench's (derived)."""
    rows, derived = [], []
    tol = entry["tolerance"]
    for strategy, segments in entry["rows"].items():
        point = _point(table, strategy=strategy)
        ours = {segment: 100 * sum(point[c] for c in columns) for segment, columns in FIG2_SEGMENTS.items()}
        graded = dict(ours)
        if {"internal", "external"} & set(segments):
            folder = _points_dir(points_dir, "fig2")
            split = artifact.fig2_split(config_of(folder, point), *_point_tables(folder, point))
            graded["internal"], graded["external"] = 100 * split.internal_frac, 100 * split.external_frac
        for segment, paper in segments.items():
            key = f"{strategy}/{segment}"
            rows.append(_abs_row(entry, f"{strategy}: {segment}", key, paper, graded[segment], tol, "%"))
            if segment in ("internal", "external") and not math.isclose(graded[segment], ours[segment]):
                derived.append(_derived(entry, _abs_row(entry, f"{strategy}: {segment}, workbench accounting",
                                                        "derived", paper, ours[segment], tol, "%", kind=DERIVED)))
    return rows + derived


def config_of(points_dir: Path, point: pd.Series) -> RunConfig:
    """The point's run configuration, as its config.json records it."""
    recorded = json.loads((points_dir / point["point_id"] / "config.json").read_text())
    return RunConfig.from_dict(recorded["config"])


def fig12(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The rate a system sustains = its token throughput while a queue is present (Fig. 12's knee), for
    each model: ShareGPT's ratios against the text's range, Alpaca's comparison of OPT-175B."""
    def ratio(model: str, workload: str, other: str) -> float:
        sub = table[(table["model"] == model) & table["workload"].str.contains(workload)]
        return _sustained_ratio(sub, "paged", other)

    models = list(dict.fromkeys(table["model"]))
    others = {"paged_over_oracle": "contiguous-oracle", "paged_over_max": "contiguous-max"}
    rows = []
    for key, spec in entry["rows"]["sharegpt"].items():
        for model in models:
            rows.append(_range_row(entry, f"sharegpt, {model}: {key.replace('_', ' ')}", key, spec,
                                   ratio(model, "sharegpt", others[key])))
    spec = entry["rows"]["alpaca"]["opt175b_oracle_advantage_over_others"]
    smaller = [m for m in models if m != "opt-175b"]
    advantage = (ratio("opt-175b", "alpaca", "contiguous-oracle")
                 / min(ratio(m, "alpaca", "contiguous-oracle") for m in smaller))
    rows.append(_range_row(entry, "alpaca: opt-175b's paged / oracle over the other models' smallest",
                           "opt175b_oracle_advantage_over_others", spec, advantage))
    return rows


def fig13(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    rows = []
    for setting, systems in entry["rows"].items():
        workload_kind = "sharegpt" if setting.startswith("sharegpt") else "alpaca"
        sub = table[table["workload"].str.contains(workload_kind)]
        for strategy, paper in systems.items():
            ours = _point(sub, strategy=strategy)["mean_batch_size"]
            rows.append(_rel_row(entry, f"{setting}: {strategy}", f"{setting}/{strategy}", paper, ours,
                                 entry["tolerance_frac"]))
    return rows


def fig15(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The artifact's estimator at the artifact's rate (graded); the workbench's at `derived_rate`."""
    rows, derived = [], []
    folder = _points_dir(points_dir, "fig15")
    for key, paper in entry["rows"].items():
        mode, width = key.split("-")
        where = {"n": int(width), "beam_width": 1} if mode == "parallel" else {"n": 1, "beam_width": int(width)}
        point = _point(table, rate=entry["rate"], **where)
        steps, _ = _point_tables(folder, point)
        ours = 100 * artifact.fig15_saving(steps)
        rows.append(_rel_row(entry, f"{key}, {entry['rate']:g} req/s", key, paper, ours, entry["tolerance_frac"]))
        own = 100 * _point(table, rate=entry["derived_rate"], **where)["block_sharing_saving_frac"]
        derived.append(_derived(entry, _rel_row(entry, f"{key}, {entry['derived_rate']:g} req/s, workbench estimator",
                                                "derived", paper, own, entry["tolerance_frac"], kind=DERIVED)))
    return rows + derived


def sec63(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The artifact's sharing estimator on ShareGPT."""
    rows = []
    folder = _points_dir(points_dir, "sec63")
    for key, paper in entry["rows"].items():
        mode, width = key.split("-")
        where = {"n": int(width), "beam_width": 1} if mode == "parallel" else {"n": 1, "beam_width": int(width)}
        steps, _ = _point_tables(folder, _point(table, **where))
        rows.append(_rel_row(entry, key, key, paper, 100 * artifact.fig15_saving(steps), entry["tolerance_frac"]))
    return rows


def fig14(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """paged's sustained rate over Orca (Oracle)'s, at each beam width."""
    rows = []
    for key, spec in entry["rows"].items():
        sub = table[table["beam_width"] == spec["beam_width"]]
        ratio = _sustained_ratio(sub, "paged", "contiguous-oracle")
        rows.append(_rel_row(entry, f"{key}: paged / oracle", key, spec["paper"], ratio, entry["tolerance_frac"]))
    return rows


def fig17(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """paged's sustained rate over each Orca baseline's on the chatbot workload."""
    return [_rel_row(entry, f"paged / {strategy}", strategy, paper, _sustained_ratio(table, "paged", strategy),
                     entry["tolerance_frac"])
            for strategy, paper in entry["rows"].items()]


def prefix(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    rows = []
    for key, paper in entry["rows"].items():
        prefix_tokens = key.rsplit("-", 1)[1]
        sub = table[table["workload"].str.contains(f"system={prefix_tokens},")]
        ratio = _sustained_ratio(sub, "paged-prefix", "contiguous-oracle")
        rows.append(_rel_row(entry, f"{key}: paged-prefix / oracle", key, paper, ratio, entry["tolerance_frac"]))
    return rows


def fig18a(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    rows = []
    for key, spec in entry["rows"].items():
        paper = spec["paged_us"] - spec["contiguous_us"]
        ours = 1e6 * micro.paged_attention_extra_s(spec["batch"], spec["context"])
        rows.append(_abs_row(entry, f"paged - contiguous kernel, batch {spec['batch']}, context {spec['context']}",
                             key, paper, ours, entry["tolerance"], " us"))
    return rows


def fig19a(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    return [_abs_row(entry, f"swap in + out, block {spec['block_size']}", key, spec["ms"],
                     1e3 * micro.swap_in_out_s(spec["block_size"]), entry["tolerance"], " ms")
            for key, spec in entry["rows"].items()]


def sec73(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    ours = {"crossover_block": float(micro.crossover_block_size()),
            "recompute_over_swap_max": micro.recompute_over_swap_max()}
    items = {"crossover_block": "smallest block size where swapping beats recomputing",
             "recompute_over_swap_max": "recompute / swap, largest over block sizes"}
    return [_range_row(entry, items[key], key, spec, ours[key]) for key, spec in entry["rows"].items()]


def vidur_rows(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    """The clock's decoder layer (less attention) beside Vidur's profiled one, at each row's batch shape."""
    compared = vidur.comparison().set_index(["gpu", "model", "num_tokens", "group"])
    rows = []
    for key, spec in entry["rows"].items():
        point = compared.loc[(spec["gpu"], spec["model"], spec["num_tokens"], "layer")]
        item = f"{spec['model']} on {spec['gpu']}, {spec['shape']}: ms per layer less attention"
        rows.append(_rel_row(entry, item, key, round(float(point["vidur_ms"]), 4), float(point["clock_ms"]),
                             entry["tolerance_frac"]))
    return rows


def best_block_sizes(table: pd.DataFrame, within_frac: float) -> list[int]:
    """Block sizes whose normalized latency is within `within_frac` of the best one."""
    lat = table.set_index("block_size")["normalized_latency_s_per_tok"]
    return sorted(int(b) for b in lat.index[lat <= lat.min() * (1 + within_frac)])


def fig18b(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The sweet spot (block sizes within `within_frac` of the best) must be the paper's set: every
    swept size inside the paper's range near-best, every size outside it not."""
    rows = []
    for key, spec in entry["rows"].items():
        sub = table[table["workload"].str.contains(key)]
        sizes = best_block_sizes(sub, entry["within_frac"])
        lo, hi = (float(v) for v in spec["range"])
        expected = [int(b) for b in sorted(sub["block_size"]) if lo <= b <= hi]
        ok = sizes == expected
        best = sub.set_index("block_size")["normalized_latency_s_per_tok"]
        rows.append(Row(_cite_short(entry), f"{key}: best block sizes", _kind(entry, key), str(spec["paper"]),
                        float(best.idxmin()), ", ".join(map(str, sizes)), ok,
                        f"within {entry['within_frac']:.0%} of best: exactly {', '.join(map(str, expected))}",
                        _source(entry), "" if ok else _gap(entry, key)))
    return rows


def fig19(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    rows = []
    lat = table.pivot(index="block_size", columns="preemption", values="normalized_latency_s_per_tok")
    for key, spec in entry["rows"].items():
        ratio = float((lat["swap"] / lat["recompute"]).loc[spec["blocks"]].mean())
        rows.append(_range_row(entry, f"swap / recompute latency, blocks {spec['blocks'][0]}-{spec['blocks'][-1]}",
                               key, spec, ratio))
    return rows


SECTIONS = {"table1": table1, "fig2": fig2, "fig12": fig12, "fig13": fig13, "fig15": fig15, "sec63": sec63,
            "fig14": fig14, "fig17": fig17, "prefix": prefix,
            "fig18a": fig18a, "fig19a": fig19a, "sec73": sec73, "fig18b": fig18b, "fig19": fig19,
            "vidur": vidur_rows}
CLOCK = "clock"  # the `experiment` of a section computed on the clock alone
PRESETS = "presets"  # the `experiment` of a section computed from resolved configurations
VIDUR = "vidur"  # the `experiment` of the section read from Vidur's profiled operators
NO_RUN_SOURCES = {CLOCK: "workbench/paper/micro.py", PRESETS: "workbench/presets.py",
                  VIDUR: "workbench/paper/vidur.py"}


def build_rows(values: dict[str, Any], tables: dict[str, pd.DataFrame],
               points_dirs: dict[str, Path] | None = None) -> list[Row]:
    """Every row, in the order of values.yaml; `tables` maps an experiment file name to its summary and
    `points_dirs` to the directory of its points (needed by the sections that read a point's tables)."""
    rows: list[Row] = []
    for section, entry in values.items():
        name = entry["experiment"]
        if name in NO_RUN_SOURCES:
            rows += SECTIONS[section](entry)
        else:
            rows += SECTIONS[section](entry, tables[name], (points_dirs or {}).get(name))
    return rows


def counts_by_kind(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """(rows within their band, rows) for each kind that grades, in KINDS order."""
    return {kind: (sum(r.ok for r in rows if r.kind == kind), sum(r.kind == kind for r in rows))
            for kind in KINDS if kind != DERIVED and any(r.kind == kind for r in rows)}


def headline(rows: list[Row]) -> str:
    counts = counts_by_kind(rows)
    within, total = counts.get(PREDICTION, (0, 0))
    others = "; ".join(f"{kind}: {k} of {n}" for kind, (k, n) in counts.items() if kind != PREDICTION)
    derived = sum(r.kind == DERIVED for r in rows)
    return (f"Predictions: {within} of {total} within their band. Not predictions, so not counted: {others}; "
            f"{derived} derived rows (the workbench's own definitions beside the artifact's), not graded.")


def markdown(rows: list[Row], values: dict[str, Any] | None = None) -> str:
    lines = ["| figure | quantity | kind | paper | workbench | difference | band | within | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        value = "nan" if math.isnan(r.workbench) else f"{r.workbench:.4g}"
        within = "(not graded)" if r.kind == DERIVED else ("yes" if r.ok else "no")
        lines.append(f"| {r.figure} | {r.item} | {r.kind} | {r.paper} | {value} | {r.diff} | {r.tolerance} | "
                     f"{within} | `{r.experiment}` |")
    gaps = [r for r in rows if not r.ok and r.kind != DERIVED]
    if gaps:
        lines += ["", "Outside the band:", ""]
        lines += [f"- **{r.figure}, {r.item}** ({r.kind}): {r.reason}" for r in gaps]
    derived = [r for r in rows if r.kind == DERIVED]
    if derived:
        reasons = dict.fromkeys(f"- **{r.figure}**: {r.reason}" for r in derived)
        lines += ["", "Derived rows:", "", *reasons]
    if values is not None:
        lines += ["", "Where each band comes from:", ""]
        lines += [f"- **{_cite_short(entry)}**: {entry['band']}" for entry in values.values()]
    return "\n".join(lines) + "\n"
