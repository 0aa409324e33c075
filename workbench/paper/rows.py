"""The table's rows: the paper's value from values.yaml beside the workbench's, read from sweep summaries.

Each section function takes its entry of values.yaml, the summary table of its experiment (one row
per point, workbench.sweep.summary) and the directory of its points (for the sections that read a
point's step and request tables), and returns `Row`s (workbench.paper.row). Paper numbers come only from
the YAML, and the peer's (Vidur's profiled operator times) from its published data (workbench/paper/data).
workbench.paper.report writes them as the table. An experiment run at several seeds gives each row per
seed: the row shows the median and the spread, its verdict is the median's, and a verdict that differs
between seeds marks the row seed-sensitive, never counted within its band (`over_seeds`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.config import RunConfig
from workbench.paper import artifact, micro, vidur
from workbench.paper.fit_block_costs import KERNEL_BLOCK_SIZE, KERNEL_US
from workbench.paper.row import (
    DERIVED,
    NOT_GRADED,
    SPLIT,
    UNGRADED,
    Row,
    cite_short,
)
from workbench.workload.build import build_workload


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
    return Row(cite_short(entry), item, kind or _kind(entry, key), f"{paper:g}{unit}", ours,
               f"{ours - paper:+.1f}{points}", ok, f"±{tol:.3g}{points}", _source(entry),
               "" if ok else _gap(entry, key),
               remake=lambda value: _abs_row(entry, item, key, paper, value, tol, unit, kind))


def _sustained_ratio(table: pd.DataFrame, strategy: str, baseline: str) -> float:
    """The rate `strategy` sustains over `baseline`'s on one workload: their token throughputs while a queue
    is present (the knee of a latency-vs-rate curve)."""
    return (_point(table, strategy=strategy)["throughput_tok_s_sat"]
            / _point(table, strategy=baseline)["throughput_tok_s_sat"])


def _rel_row(entry, item, key, paper: float, ours: float, tol_frac: float, kind: str | None = None) -> Row:
    ok = abs(ours - paper) <= tol_frac * abs(paper)
    return Row(cite_short(entry), item, kind or _kind(entry, key), f"{paper:g}", ours,
               f"{(ours - paper) / paper:+.0%}", ok, f"±{tol_frac:.0%}", _source(entry),
               "" if ok else _gap(entry, key),
               remake=lambda value: _rel_row(entry, item, key, paper, value, tol_frac, kind))


def _range_row(entry, item, key, spec: dict, ours: float) -> Row:
    lo, hi = (float(v) for v in spec["range"])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{cite_short(entry)}, {key}: a band must be two-sided, not [{lo}, {hi}]")
    ok = lo <= ours <= hi
    side = "inside" if ok else ("below" if ours < lo else "above")
    return Row(cite_short(entry), item, _kind(entry, key), str(spec["paper"]), ours, side, ok,
               f"in [{lo:g}, {hi:g}]", _source(entry), "" if ok else _gap(entry, key),
               remake=lambda value: _range_row(entry, item, key, spec, value))


def _ungraded_row(entry, item, key, ours: float) -> Row:
    """A value the table shows beside a claim it cannot grade (the paper's number is not verified)."""
    return Row(cite_short(entry), item, UNGRADED, str(entry["rows"][key]["paper"]), ours, "", False, "none",
               _source(entry), _gap(entry, key), remake=lambda value: _ungraded_row(entry, item, key, value))


def _derived(entry: dict, row: Row) -> Row:
    """A derived row always carries the section's explanation of the two definitions."""
    remake = row.remake
    return dataclasses.replace(row, reason=_gap(entry, "derived"),
                               remake=None if remake is None else lambda value: _derived(entry, remake(value)))


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
        if all(_kind(entry, f"{strategy}/{s}") == SPLIT for s in ("internal", "external")):
            rows.append(_split_row(entry, strategy, segments, graded))
    return rows + derived


def _split_row(entry: dict, strategy: str, paper: dict, ours: dict) -> Row:
    """Where the scored sum internal + external splits: internal's share of it, the one quantity of the two
    rows that no scoring fixed. Its band is the segments' band over the paper's sum."""
    paper_sum, ours_sum = paper["internal"] + paper["external"], ours["internal"] + ours["external"]
    tol = entry["tolerance"] * 100 / paper_sum
    return _abs_row(entry, f"{strategy}: internal share of internal + external", f"{strategy}/split",
                    round(100 * paper["internal"] / paper_sum, 1), 100 * ours["internal"] / ours_sum, tol, "%")


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
    # the abstract's "2-4x" over the Orca baselines: the median of every model, dataset and baseline's ratio
    baselines = sorted(set(table["strategy"]) - {"paged"})
    every = [ratio(m, w, b) for m in models for w in ("sharegpt", "alpaca") for b in baselines]
    rows.append(_range_row(entry, "abstract: paged over Orca, median of every model, dataset and baseline",
                           "abstract", entry["rows"]["abstract"], statistics.median(every)))
    return rows


def fig12_ft(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The rate vLLM sustains over the paper's FasterTransformer baseline, per model: paged with continuous
    batching over static batches reserving max_model_len per request (`--batching static`)."""
    rows = []
    for key, spec in entry["rows"].items():
        sub = table[table["model"] == spec["model"]]
        rows.append(_range_row(entry, f"sharegpt, {spec['model']}: paged over FasterTransformer (static batches)",
                               key, spec, _sustained_ratio(sub, "paged", "contiguous-max")))
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
        rows.append(_abs_row(entry, f"{key}, {entry['rate']:g} req/s", key, paper, ours, entry["tolerance"], "%"))
        own = 100 * _point(table, rate=entry["derived_rate"], **where)["block_sharing_saving_frac"]
        derived.append(_derived(entry, _abs_row(entry, f"{key}, {entry['derived_rate']:g} req/s, workbench estimator",
                                                "derived", paper, own, entry["tolerance"], "%", kind=DERIVED)))
    return rows + derived


def sec63(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """The artifact's sharing estimator on ShareGPT."""
    rows = []
    folder = _points_dir(points_dir, "sec63")
    for key, paper in entry["rows"].items():
        mode, width = key.split("-")
        where = {"n": int(width), "beam_width": 1} if mode == "parallel" else {"n": 1, "beam_width": int(width)}
        steps, _ = _point_tables(folder, _point(table, **where))
        rows.append(_abs_row(entry, key, key, paper, 100 * artifact.fig15_saving(steps), entry["tolerance"], "%"))
    return rows


def fig14(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """paged's sustained rate over Orca (Oracle)'s, at each beam width."""
    rows = []
    for key, spec in entry["rows"].items():
        sub = table[(table["beam_width"] == spec["beam_width"]) & (table["n"] == spec["n"])]
        ratio = _sustained_ratio(sub, "paged", "contiguous-oracle")
        if _kind(entry, key) == UNGRADED:
            rows.append(_ungraded_row(entry, f"{key}: paged / oracle", key, ratio))
        else:
            rows.append(_rel_row(entry, f"{key}: paged / oracle", key, spec["paper"], ratio, entry["tolerance_frac"]))
    return rows


def fig14_order(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """Whether paged's sustained rate over Orca (Oracle)'s rises at each step of the sample counts `n` (basic
    sampling first); the value is the last count's gain over the first's."""
    rows = []
    for key, spec in entry["rows"].items():
        gains = [_sustained_ratio(table[(table["beam_width"] == 1) & (table["n"] == n)], "paged", "contiguous-oracle")
                 for n in spec["n"]]
        steps = list(itertools.pairwise(gains))
        ok = all(b > a for a, b in steps)
        order = " ".join(f"{a:.3g} {'<' if b > a else '>='}" for a, b in steps) + f" {gains[-1]:.3g}"
        rows.append(Row(cite_short(entry), f"{key}: paged / oracle at n = {', '.join(map(str, spec['n']))}, "
                        f"last over first", _kind(entry, key), str(spec["paper"]), gains[-1] / gains[0], order, ok,
                        "each above the last", _source(entry), "" if ok else _gap(entry, key)))
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
    """The clock's decoder layer (less attention) beside Vidur's profiled one at every profiled row count
    from 1 to 4,096 (vidur.DATA_ALL); the anchor rows of values.yaml, at named batch shapes, are listed and
    the rest only counted. A pair's kind is its anchors' (the fitted pair's are fit targets)."""
    compared = vidur.comparison(vidur.DATA_ALL)
    layers = compared[compared["group"] == "layer"]
    anchors = {(spec["gpu"], spec["model"], spec["num_tokens"]): (key, spec) for key, spec in entry["rows"].items()}
    pair_kind = {(spec["gpu"], spec["model"]): _kind(entry, key) for key, spec in entry["rows"].items()}
    rows = []
    for point in layers.itertuples():
        anchor = anchors.get((point.gpu, point.model, point.num_tokens))
        if anchor is None:
            shape, key, listed = f"{point.num_tokens} rows", None, False
        else:
            key, spec = anchor
            shape, listed = spec["shape"], True
        item = f"{point.model} on {point.gpu}, {shape}: ms per layer less attention"
        row = _rel_row(entry, item, key or "default", round(float(point.vidur_ms), 4), float(point.clock_ms),
                       entry["tolerance_frac"], kind=pair_kind[(point.gpu, point.model)])
        rows.append(dataclasses.replace(row, listed=listed))
    return rows


def sec71(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    """The paged kernel's slowdown over FasterTransformer's at Fig. 18a's points: the clock's extra time per
    layer (micro.paged_attention_extra_s) over the plotted FasterTransformer time, smallest and largest."""
    slowdowns = [100 * micro.paged_attention_extra_s(batch, context) / (contiguous_us / 1e6)
                 for batch, context, _, contiguous_us in KERNEL_US]
    ours = {"smallest": min(slowdowns), "largest": max(slowdowns)}
    return [_range_row(entry, f"paged kernel over FasterTransformer's, {key} over Fig. 18a's points (%)", key,
                       spec, ours[key]) for key, spec in entry["rows"].items()]


def fig11(entry: dict, table: pd.DataFrame | None = None, points_dir: Path | None = None) -> list[Row]:
    """Mean input and output lengths of each dataset as the workbench reads its file (every request)."""
    rows = []
    for dataset, spec in entry["rows"].items():
        requests = build_workload(RunConfig(workload=spec["workload"], model="opt-13b"))
        means = {"input": float(np.mean([r.prompt_tokens for r in requests])),
                 "output": float(np.mean([r.output_tokens for r in requests]))}
        for side, ours in means.items():
            rows.append(_rel_row(entry, f"{dataset}: mean {side} tokens", f"{dataset}/{side}", spec[side], ours,
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
        rows.append(Row(cite_short(entry), f"{key}: best block sizes", _kind(entry, key), str(spec["paper"]),
                        float(best.idxmin()), ", ".join(map(str, sizes)), ok,
                        f"within {entry['within_frac']:.0%} of best: exactly {', '.join(map(str, expected))}",
                        _source(entry), "" if ok else _gap(entry, key)))
    return rows


def fig18b_shape(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    """How the normalized latency rises at small blocks: block 1's over block 16's, per dataset."""
    rows = []
    for key, spec in entry["rows"].items():
        lat = table[table["workload"].str.contains(key)].set_index("block_size")["normalized_latency_s_per_tok"]
        item = f"{key}: normalized latency, block 1 over block 16"
        ratio = float(lat.loc[1] / lat.loc[KERNEL_BLOCK_SIZE])
        graded = _kind(entry, key) != UNGRADED
        rows.append(_range_row(entry, item, key, spec, ratio) if graded else _ungraded_row(entry, item, key, ratio))
    return rows


def fig19(entry: dict, table: pd.DataFrame, points_dir: Path | None = None) -> list[Row]:
    rows = []
    lat = table.pivot(index="block_size", columns="preemption", values="normalized_latency_s_per_tok")
    for key, spec in entry["rows"].items():
        ratio = float((lat["swap"] / lat["recompute"]).loc[spec["blocks"]].mean())
        rows.append(_range_row(entry, f"swap / recompute latency, blocks {spec['blocks'][0]}-{spec['blocks'][-1]}",
                               key, spec, ratio))
    return rows


SECTIONS = {"table1": table1, "fig11": fig11, "fig2": fig2, "fig12": fig12, "fig12_ft": fig12_ft, "fig13": fig13,
            "fig15": fig15, "sec63": sec63, "fig14": fig14, "fig14_order": fig14_order, "fig17": fig17,
            "prefix": prefix, "fig18a": fig18a, "sec71": sec71, "fig19a": fig19a, "sec73": sec73, "fig18b": fig18b,
            "fig18b_shape": fig18b_shape, "fig19": fig19, "vidur": vidur_rows}
CLOCK = "clock"  # the `experiment` of a section computed on the clock alone
PRESETS = "presets"  # the `experiment` of a section computed from resolved configurations
TRACES = "traces"  # the `experiment` of a section computed from the length files as the workbench reads them
VIDUR = "vidur"  # the `experiment` of the section read from Vidur's profiled operators
NO_RUN_SOURCES = {CLOCK: "workbench/paper/micro.py", PRESETS: "workbench/presets.py",
                  TRACES: "workbench/workload/build.py", VIDUR: "workbench/paper/vidur.py"}


def build_rows(values: dict[str, Any], tables: dict[str, pd.DataFrame],
               points_dirs: dict[str, Path] | None = None) -> list[Row]:
    """Every row, in the order of values.yaml; `tables` maps an experiment file name to its summary and
    `points_dirs` to the directory of its points (needed by the sections that read a point's tables). A
    summary holding several seeds gives each row per seed, combined by `over_seeds`."""
    rows: list[Row] = []
    for section, entry in values.items():
        name = entry["experiment"]
        if name in NO_RUN_SOURCES:
            rows += SECTIONS[section](entry)
            continue
        table, folder = tables[name], (points_dirs or {}).get(name)
        seeds = sorted(set(table["seed"]))
        per_seed = [SECTIONS[section](entry, table[table["seed"] == seed], folder) for seed in seeds]
        rows += per_seed[0] if len(seeds) == 1 else [over_seeds(list(group), seeds)
                                                     for group in zip(*per_seed, strict=True)]
    return rows


def over_seeds(rows: list[Row], seeds: list[int] | None = None) -> Row:
    """One row from the same row at each of `seeds` (default 0, 1, ...): the median value, graded against the
    same band (a row whose value is not a number on the band's scale, such as a set of block sizes, takes
    the majority verdict), with each seed's value and verdict beside it; a seed-sensitive row's reason
    begins with the seeds on each side of the band."""
    seeds = list(range(len(rows))) if seeds is None else seeds
    if len({(r.figure, r.item) for r in rows}) != 1:
        raise ValueError(f"rows of different items cannot be combined over seeds: {[r.item for r in rows]}")
    values, oks = tuple(r.workbench for r in rows), tuple(r.ok for r in rows)
    median = statistics.median(values)
    first = rows[0]
    if first.remake is not None:
        combined = first.remake(median)
    else:
        ok = sum(oks) > len(oks) / 2
        combined = dataclasses.replace(first, workbench=median, ok=ok,
                                       diff="; ".join(dict.fromkeys(r.diff for r in rows)),
                                       reason="" if ok else next(r.reason for r in rows if not r.ok))
    if any(not r.ok for r in rows) and not combined.reason and combined.kind not in NOT_GRADED:
        combined = dataclasses.replace(combined, reason=next(r.reason for r in rows if not r.ok))
    if len(set(oks)) > 1 and combined.kind not in NOT_GRADED:
        inside = ", ".join(f"{seed} ({r.workbench:.4g})" for seed, r in zip(seeds, rows, strict=True) if r.ok)
        outside = ", ".join(f"{seed} ({r.workbench:.4g})" for seed, r in zip(seeds, rows, strict=True) if not r.ok)
        text = f"Seed-sensitive: inside the band at seed {inside}, outside at seed {outside}."
        combined = dataclasses.replace(combined, reason=f"{text} {combined.reason}".strip())
    return dataclasses.replace(combined, seed_values=values, seed_oks=oks)


