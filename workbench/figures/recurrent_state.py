"""recurrent_state: prefix caching of a hybrid model's recurrent state: what each checkpoint policy
(`--state-checkpoints`) gives in hits, time to first token and throughput as its checkpoints get more memory.

One row per workload: token hit rate, P95 TTFT (from each point's request table, since the summary keeps p50 and
p99) and throughput against the memory checkpoints may hold (`--state-cache-gib`), the last point at the pool's
bound (the default). One color per policy: paged-prefix as lines, radix as markers. Horizontal references: the
hybrid without checkpoints (`none`: its attention blocks are cached, but a hit also needs the state where it
ends, so nothing hits) and the model's attention-only counterpart (no state: every cached block can hit).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from workbench.figures import style
from workbench.figures.coincide import coinciding
from workbench.presets import GIB, model_from_name
from workbench.sweep.layout import POINTS_DIR

POLICY_COLORS = {"align": "#56B4E9", "all": "#E69F00", "tree": "#009E73", "marconi": "#D55E00"}
NONE_STYLE = {"color": "#999999", "linestyle": ":", "linewidth": 1.2}
ATTENTION_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.0}
NONE_LABEL, ATTENTION_LABEL = "none (no checkpoints)", "attention-only model"
LINE_STRATEGY, MARKER_STRATEGY = "paged-prefix", "radix"
PANELS = (("prefix_hit_rate", 100.0, "Token hit rate (%)"), ("ttft_p95_s", 1.0, "TTFT p95 (s)"),
          ("throughput_tok_s", 1e-3, "Throughput (k tok/s)"))
TTFT_PERCENTILE = 95
# the synthetic workloads of experiments/fig_recurrent_state.yaml by what they stand for
WORKLOAD_LABELS = {
    "system-prompt:k=16,system=4096,lengths=sharegpt": "Tool-and-agent-like (16 shared prompts of 4,096 tokens)",
    "multi-turn:lengths=sharegpt": "ShareGPT-like multi-turn chat",
}


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    summary = with_ttft_p95(summary, sweep_dir)
    workloads = list(dict.fromkeys(summary["workload"]))
    fig, axes = style.new_figure(len(workloads), len(PANELS), width_in=style.PAGE_WIDTH_IN,
                                 height_in=2.0 * len(workloads) + 0.4)
    axes = np.asarray(axes).reshape(len(workloads), len(PANELS))
    for row, workload in zip(axes, workloads, strict=True):
        points = summary[summary["workload"] == workload]
        for ax, (_, ylabel, groups, references) in zip(row, _panels(points), strict=True):
            for labels, x, y, line_style in groups:
                ax.plot(x, y, **{**line_style, "label": " = ".join(labels)})
            for labels, value, line_style in references:
                ax.axhline(value, **{**line_style, "label": " = ".join(labels)})
            ax.set_xscale("log", base=2)
            ticks = budget_ticks(points)
            ax.set_xticks(list(ticks), list(ticks.values()))
            ax.minorticks_off()
            # from 0: where the replica keeps up with its load, throughputs differ by fractions of a percent that a
            # free axis would magnify
            ax.set_ylim(bottom=0)
            ax.set_ylabel(ylabel)
        # over the middle panel: constrained layout keeps a title's centre inside its column, and a row-long title
        # on the left panel would push the others aside
        row[1].set_title(row_title(workload, points), fontsize=7)
    fig.supxlabel("Checkpoint memory (GiB)", fontsize=8)
    policies = [p for p in POLICY_COLORS if (summary["state_checkpoints"] == p).any()]
    handles = [Line2D([], [], color=POLICY_COLORS[p], marker="o", markersize=3, label=p) for p in policies]
    handles += [Line2D([], [], **NONE_STYLE, label=NONE_LABEL),
                Line2D([], [], **ATTENTION_STYLE, label=ATTENTION_LABEL)]
    axes[0, -1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if (summary["strategy"] == MARKER_STRATEGY).any():
        shapes = [Line2D([], [], color="#444444", marker="o", markersize=3, label=style.strategy_label(LINE_STRATEGY)),
                  Line2D([], [], color="#444444", marker="x", markersize=4, linestyle="None",
                         label=style.strategy_label(MARKER_STRATEGY))]
        axes[-1, -1].legend(handles=shapes, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def row_title(workload: str, points: pd.DataFrame) -> str:
    """The workload and how much of it ran, at which rate."""
    requests = int(points["num_requests"].max())
    label = WORKLOAD_LABELS.get(workload, style.workload_label(workload))
    return f"{label}: {requests:,} requests at {points['rate'].iloc[0]:g} req/s"


def _panels(points: pd.DataFrame):
    """Per panel of one workload's row: its summary key, y label, the policies' series grouped where they coincide point
    for point (labels, x, y, line style) and the references grouped the same way (labels, value, line style)."""
    out = []
    for key, scale, ylabel in PANELS:
        series = []
        for policy, color in POLICY_COLORS.items():
            for strategy, shape in ((LINE_STRATEGY, {"marker": "o", "markersize": 3}),
                                    (MARKER_STRATEGY, {"marker": "x", "markersize": 4, "linestyle": "None"})):
                rows = policy_line(points, strategy, policy)
                if len(rows):
                    series.append((f"{policy}, {strategy}", rows["checkpoint_gib"].to_numpy(),
                                   rows[key].to_numpy(dtype=float) * scale, {"color": color, **shape}))
        references: list[tuple[list[str], float, dict]] = []  # drawn once per value, as coinciding series are
        for label, rows, line_style in ((NONE_LABEL, no_checkpoints(points), NONE_STYLE),
                                        (ATTENTION_LABEL, attention_only(points), ATTENTION_STYLE)):
            for strategy, part in rows.groupby("strategy", sort=False):
                value = float(part[key].iloc[0]) * scale
                same = next((r for r in references if r[1] == value), None)
                if same is None:
                    references.append(([f"{label}, {strategy}"], value, line_style))
                else:
                    same[0].append(f"{label}, {strategy}")
        out.append((key, ylabel, coinciding(series), references))
    return out


def with_ttft_p95(summary: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """The summary with `ttft_p95_s`: the 95th percentile of each point's finished requests' time to first token,
    as the summary's ttft_p50_s and ttft_p99_s are taken (workbench.results)."""
    if "ttft_p95_s" in summary.columns:
        return summary
    return summary.assign(ttft_p95_s=[ttft_percentile(sweep_dir, point_id, TTFT_PERCENTILE)
                                      for point_id in summary["point_id"]])


def ttft_percentile(sweep_dir: Path, point_id: str, q: float) -> float:
    """The q-th percentile (s) of TTFT over the point's finished requests; 0 when none finished, as the summary's."""
    requests = pd.read_parquet(Path(sweep_dir) / POINTS_DIR / point_id / "requests.parquet",
                               columns=["arrival_s", "first_token_s", "status"])
    done = requests[requests["status"] == "finished"]
    ttft = done["first_token_s"].to_numpy() - done["arrival_s"].to_numpy()  # [num_finished]
    return float(np.percentile(ttft, q)) if ttft.size else 0.0


def has_state(model: str) -> bool:
    return model_from_name(model).has_state


def attention_only(points: pd.DataFrame) -> pd.DataFrame:
    return points[~points["model"].map(has_state)]


def no_checkpoints(points: pd.DataFrame) -> pd.DataFrame:
    return points[points["model"].map(has_state) & (points["state_checkpoints"] == "none")]


def pool_gib(row) -> float:
    """The KV pool of a summary row in GiB: the checkpoint budget when `state_cache_gib` is not given."""
    return row.kv_slots * model_from_name(row.model).kv_bytes_per_token(row.kv_dtype) / GIB


def policy_line(points: pd.DataFrame, strategy: str, policy: str) -> pd.DataFrame:
    """One policy's points of one strategy by checkpoint memory (`checkpoint_gib`: the pool's GiB where unset)."""
    rows = points[(points["strategy"] == strategy) & (points["state_checkpoints"] == policy)
                  & points["model"].map(has_state)]
    gib = [pool_gib(r) if pd.isna(r.state_cache_gib) else float(r.state_cache_gib) for r in rows.itertuples()]
    return rows.assign(checkpoint_gib=gib).sort_values("checkpoint_gib")


def budget_ticks(points: pd.DataFrame) -> dict[float, str]:
    """x ticks: each budget given, and the pool's bound labelled as such."""
    stateful = points[points["model"].map(has_state) & (points["state_checkpoints"] != "none")]
    ticks = {float(g): f"{g:g}" for g in sorted(stateful["state_cache_gib"].dropna().unique())}
    for row in stateful[stateful["state_cache_gib"].isna()].itertuples():
        ticks[pool_gib(row)] = f"pool\n{pool_gib(row):.3g}"
    return dict(sorted(ticks.items()))


def caption_note(summary: pd.DataFrame) -> str:
    """Per workload, paged-prefix's hit rate of each policy at its largest checkpoint memory beside the
    attention-only model's, and the series of the hit rate and throughput panels drawn once because they coincide
    at every point (the request tables that TTFT p95 needs are not read here)."""
    lines = []
    for workload, points in summary.groupby("workload", sort=False):
        name = WORKLOAD_LABELS.get(workload, style.workload_label(workload)).split(" (")[0]
        hits = [f"{policy} {rows['prefix_hit_rate'].iloc[-1]:.1%}" for policy in POLICY_COLORS
                if len(rows := policy_line(points, LINE_STRATEGY, policy))]
        reference = attention_only(points)
        if len(reference):
            hits.append(f"attention-only {reference['prefix_hit_rate'].iloc[0]:.1%}")
        lines.append(f"{name}, hit rate at the largest checkpoint memory: {', '.join(hits)}")
        for key, _, groups, _ in _panels(points.assign(ttft_p95_s=np.nan)):
            merged = "; ".join(" = ".join(map(_short, labels)) for labels, *_ in groups if len(labels) > 1)
            if key != "ttft_p95_s" and merged:
                lines.append(f"{name}, {key} drawn once where equal: {merged}")
    return "\n".join(lines)


def _short(label: str) -> str:
    """A series' label in a caption: the policy, and the strategy only for the markers."""
    policy, strategy = label.split(", ")
    return policy if strategy == LINE_STRATEGY else f"{policy} ({strategy})"
