"""Every figure builds from a tiny real sweep; its files exist and the plotted values are the summary's."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from tests.figures.figure_rules import figure_problems
from tests.figures.tiny_sweeps import SPECS, InProcessExecutor
from workbench.columns import SLOT_COLUMNS
from workbench.figures import style
from workbench.figures.build import build, draw
from workbench.figures.registry import FIGURE_NAMES, experiment_path
from workbench.sweep import LocalExecutor, parse_spec, read_summary

pytest.importorskip("workbench.engine", reason="the figures are built from real runs of the engine")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, pd.DataFrame]]:
    """Every figure built by `build` from its tiny sweep: name -> (sweep dir, summary)."""
    root = tmp_path_factory.mktemp("figures")
    out: dict[str, tuple[Path, pd.DataFrame]] = {}
    for name in FIGURE_NAMES:
        paths = build(name, figures_dir=root / "figures", runs_dir=root / "runs", executor=InProcessExecutor(),
                      progress=False, command="pytest", spec=parse_spec(SPECS[name], default_name=name))
        assert [p.name for p in paths] == [f"{name}.png", f"{name}.pdf", f"{name}.provenance.json"]
        for path in paths:
            assert path.stat().st_size > 0
        sweep_dir = root / "runs" / f"fig_{name}"
        out[name] = (sweep_dir, read_summary(sweep_dir))
    out["_root"] = (root, pd.DataFrame())
    return out


def figure(built, name: str):
    """The figure drawn again from the built sweep, and its visible axes."""
    fig = draw(name, built[name][0])
    return fig, [ax for ax in fig.axes if ax.get_visible()]


def test_every_figure_has_its_experiment():
    for name in FIGURE_NAMES:
        assert experiment_path(name).is_file(), name


def test_provenance(built):
    root = built["_root"][0]
    for name in FIGURE_NAMES:
        record = json.loads((root / "figures" / f"{name}.provenance.json").read_text())
        spec = parse_spec(SPECS[name], default_name=name)
        assert record["figure"] == name and record["config_hash"] == spec.config_hash()
        assert record["num_points"] == len(spec.points()) and record["command"] == "pytest"
        assert record["date"] and "git_commit" in record


def test_memory_waste_bars_are_the_summary(built):
    _, summary = built["memory_waste"]
    fig, (ax,) = figure(built, "memory_waste")
    drawn = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    for column in SLOT_COLUMNS:
        label = style.SLOT_STYLE[column][0]
        expected = summary[style.MEM_FRAC_SAT_KEY[column]].to_numpy(dtype=float) * 100
        if label in drawn:
            heights = [p.get_height() for p in drawn[label].patches]
            np.testing.assert_allclose(heights, expected, rtol=1e-12)
        else:
            assert not np.any(expected > 0), column
    assert "Token KV" in drawn and "Internal frag." in drawn
    tops = np.sum([[p.get_height() for p in c.patches] for c in drawn.values()], axis=0)
    np.testing.assert_allclose(tops, 100.0, rtol=1e-9)  # the partition covers the whole pool
    assert [t.get_text() for t in ax.get_xticklabels()][-2:] == ["vAttn\n4 KiB", "Paged\nB=16"]
    plt.close(fig)


def test_throughput_vs_rate_lines_are_the_summary(built):
    _, summary = built["throughput_vs_rate"]
    fig, (ax,) = figure(built, "throughput_vs_rate")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"Contiguous (max)", "Paged (16)"}
    for strategy, label in [("contiguous-max", "Contiguous (max)"), ("paged", "Paged (16)")]:
        rows = summary[summary["strategy"] == strategy].sort_values("rate")
        np.testing.assert_array_equal(lines[label].get_xdata(), rows["rate"])
        np.testing.assert_array_equal(lines[label].get_ydata(), rows["normalized_latency_s_per_tok"])
    assert ax.get_xlabel() == "Request rate (req/s)" and "s/token" in ax.get_ylabel()
    plt.close(fig)


def test_spec_decode_lines_are_the_summary(built):
    _, summary = built["spec_decode"]
    fig, (light, heavy, throughput, drafts) = figure(built, "spec_decode")
    label = "Paged, α=0.9"
    for ax, rate, key, scale in [(light, 2.0, "tpot_p50_s", 1e3), (heavy, 40.0, "tpot_p50_s", 1e3),
                                 (throughput, 40.0, "throughput_tok_s", 1e-3), (drafts, 40.0, "mem_draft_frac", 100)]:
        (line,) = [ln for ln in ax.get_lines() if ln.get_label().split(" = ")[0] == label]
        rows = summary[(summary["strategy"] == "paged") & (summary["rate"] == rate)]
        at_k = {k: rows[(rows["spec_tokens"] == k) & ((rows["spec_accept"] == 0.9) | (k == 0))].iloc[0]
                for k in (0, 2)}
        np.testing.assert_array_equal(line.get_xdata(), [0, 2])
        expected = [0.0 if k == 0 and key == "mem_draft_frac" else at_k[k][key] * scale for k in (0, 2)]
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
    assert len(heavy.get_lines()) == 2  # two strategies, one acceptance
    # drafts speed decoding at a light load: TPOT falls with K
    ys = {ln.get_label().split(" = ")[0]: ln.get_ydata() for ln in light.get_lines()}
    assert ys[label][1] < ys[label][0]
    plt.close(fig)


def test_admission_order_bars_are_the_summary(built):
    _, summary = built["admission_order"]
    fig, (hits, ttft, throughput) = figure(built, "admission_order")
    for ax, key, scale in [(hits, "prefix_hit_rate", 100.0), (ttft, "ttft_p50_s", 1.0),
                           (throughput, "throughput_tok_s", 1e-3)]:
        bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
        assert list(bars) == ["fcfs", "lpm", "dfs-weight", "lof", "random"]
        for order, heights in bars.items():
            rows = summary[summary["schedule"] == order]
            expected = [float(rows.loc[rows["strategy"] == s, key].iloc[0]) * scale
                        for s in ("radix", "paged-prefix") if (rows["strategy"] == s).any()]
            np.testing.assert_allclose(heights, expected, rtol=1e-12)
        assert len(bars["dfs-weight"]) == 1  # a radix tree's order only
    plt.close(fig)


def test_sharing_values_are_the_summary(built):
    _, summary = built["sharing"]
    fig, (left, right) = figure(built, "sharing")
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in left.containers}
    for width in (2, 4):
        parallel = summary[summary["n"] == width]["block_sharing_saving_frac"].iloc[0] * 100
        beam = summary[summary["beam_width"] == width]["block_sharing_saving_frac"].iloc[0] * 100
        assert bars[str(width)] == pytest.approx([parallel, beam], rel=1e-12)
    assert all(h > 0 for heights in bars.values() for h in heights), "sharing must save blocks"
    (line,) = right.get_lines()
    prefix = summary[summary["strategy"] == "paged-prefix"].sort_values("kv_slots")
    np.testing.assert_allclose(line.get_xdata(), prefix["kv_slots"] / 1000)
    np.testing.assert_allclose(line.get_ydata(), prefix["prefix_hit_rate"] * 100)
    plt.close(fig)


def test_fragmentation_timeline_stacks_the_steps(built):
    sweep_dir, summary = built["fragmentation_timeline"]
    fig, axes = figure(built, "fragmentation_timeline")
    assert len(axes) == len(summary)
    for ax, row in zip(axes, summary.itertuples(index=False), strict=True):
        steps = pd.read_parquet(sweep_dir / "points" / row.point_id / "steps.parquet")
        layers = ax.collections
        # the top edge of the last layer is the whole pool at every step (the six-way partition is exact)
        top = layers[-1].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(100.0)
        first = style.SLOT_STYLE["token_slots"][0]
        assert layers[0].get_label() == first
        token_pct = steps["token_slots"].to_numpy() / row.kv_slots * 100
        assert layers[0].get_paths()[0].vertices[:, 1].max() == pytest.approx(token_pct.max())
        assert ax.get_title() == style.point_label(row.strategy, row.block_size)
    plt.close(fig)


def test_block_size_panels_are_the_summary(built):
    sweep_dir, summary = built["block_size"]
    fig, axes = figure(built, "block_size")
    columns = [("mem_internal_frag_frac", 100.0), ("block_table_bytes_mean", 1 / 1024), (None, None),
               ("throughput_tok_s", 1.0)]
    for ax, (column, scale) in zip(axes, columns, strict=True):
        clock = "measured" if column is None else "roofline"
        groups = summary[summary["clock"] == clock].groupby(["workload", "strategy"], sort=False)
        for line, ((workload, strategy), rows) in zip(ax.get_lines(), groups, strict=True):
            rows = rows.sort_values(["block_size", "page_kib"])
            if strategy == "paged":
                assert line.get_label() == style.workload_label(workload)
                np.testing.assert_array_equal(line.get_xdata(), rows["block_size"])
            else:  # drawn at its page size: 4 and 8 KiB of 256-byte rows
                assert line.get_label().startswith(style.strategy_label(strategy))
                np.testing.assert_array_equal(line.get_xdata(), [16, 32])
            if column is None:
                expected = [decode_ns(sweep_dir, p) for p in rows["point_id"]]
            else:
                expected = rows[column].to_numpy() * scale
            np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
    roofline = summary[(summary["clock"] == "roofline") & (summary["strategy"] == "paged")].sort_values("block_size")
    for _, values in roofline.groupby("workload")["block_table_bytes_mean"]:
        assert values.is_monotonic_decreasing  # bigger blocks, shorter tables
    plt.close(fig)


def decode_ns(sweep_dir: Path, point_id: str) -> float:
    steps = pd.read_parquet(sweep_dir / "points" / point_id / "steps.parquet")
    decode = steps[(steps["kernel_time_s"] > 0) & (steps["num_prefill_tokens"] == 0)]
    assert len(decode) >= 2, "the run must time several decode-only steps"
    return float(np.percentile(decode["kernel_time_s"] / decode["token_slots"], 25)) * 1e9  # the lower quartile


def test_kernel_overhead_values_are_the_steps_decode_times(built):
    sweep_dir, summary = built["kernel_overhead"]
    fig, (left, right) = figure(built, "kernel_overhead")
    ns = pd.Series([decode_ns(sweep_dir, p) for p in summary["point_id"]], index=summary.index)
    lines = {line.get_label(): line for line in left.get_lines()}
    vattn = "Virtual contiguous (vAttention) (4 KiB)"
    assert set(lines) == {"Contiguous (oracle)", "Paged (16)", vattn}
    for label, strategy in [("Contiguous (oracle)", "contiguous-oracle"), ("Paged (16)", "paged"),
                            (vattn, "virtual-contiguous")]:
        rows = summary[(summary["strategy"] == strategy) & (summary["block_size"] == 16)]
        np.testing.assert_array_equal(lines[label].get_xdata(), [64, 256])
        np.testing.assert_allclose(lines[label].get_ydata(), ns[rows.index], rtol=1e-12)
    (ratio,) = [line for line in right.get_lines() if line.get_linestyle() != "--"]  # not the parity line
    paged = summary[(summary["strategy"] == "paged") & summary["workload"].str.contains("256")]
    paged = paged.sort_values("block_size")
    base = ns[summary[(summary["strategy"] == "contiguous-oracle") & summary["workload"].str.contains("256")].index]
    np.testing.assert_array_equal(ratio.get_xdata(), [4, 16])
    np.testing.assert_allclose(ratio.get_ydata(), ns[paged.index] / base.mean(), rtol=1e-12)
    assert np.all(np.isfinite(ratio.get_ydata())) and np.all(ratio.get_ydata() > 0)
    plt.close(fig)


def test_chunked_prefill_bars_are_the_summary(built):
    _, summary = built["chunked_prefill"]
    fig, (ttft, tpot, memory) = figure(built, "chunked_prefill")
    for ax, metric, scale in ((ttft, "ttft", 1.0), (tpot, "tpot", 1e3)):
        bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
        for pct in ("p50", "p99"):
            np.testing.assert_allclose(bars[pct], summary[f"{metric}_{pct}_s"].to_numpy() * scale, rtol=1e-12)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["whole\nprompts", "chunks\n≤64"]
    stacks = [[p.get_height() for p in c.patches] for c in memory.containers]
    np.testing.assert_allclose(np.sum(stacks, axis=0), 100.0, rtol=1e-9)  # the partition covers the whole pool
    plt.close(fig)


def test_fleet_bars_are_the_summary(built):
    _, everything = built["fleet"]
    summary = everything[everything["prefill_replicas"] == 0]
    fig, (hits, ttft, layouts, tpot) = figure(built, "fleet")
    bars = [p for p in hits.patches if p.get_height() > 0]
    assert len(bars) == len(summary)
    heights = sorted(round(p.get_height(), 9) for p in bars)
    assert heights == sorted(round(v * 100, 9) for v in summary["prefix_hit_rate"])
    medians = sorted(round(p.get_height(), 12) for p in ttft.patches)
    assert medians == sorted(round(v, 12) for v in summary["ttft_p50_s"])
    assert [t.get_text() for t in hits.get_xticklabels()] == ["round-robin", "cache-aware"]
    # colocated against disaggregated at equal GPU count, behind cache-aware
    assert [t.get_text() for t in layouts.get_xticklabels()] == ["2 colocated", "1P + 1D", "3 colocated", "1P + 2D"]
    order = [(2, 0), (2, 1), (3, 0), (3, 1)]
    rows = everything[everything["router"] == "cache-aware"].set_index(["replicas", "prefill_replicas"]).loc[order]
    np.testing.assert_allclose([p.get_height() for p in layouts.patches], rows["ttft_p50_s"], rtol=1e-12)
    np.testing.assert_allclose(tpot.lines[0].get_ydata(), rows["tpot_p99_s"] * 1e3, rtol=1e-12)
    assert (everything["kv_transfer_bytes"][everything["prefill_replicas"] > 0] > 0).all()


def test_a_rebuild_reuses_the_finished_points(built):
    root = built["_root"][0]
    before = {p.name: p.stat().st_mtime_ns for p in (root / "runs" / "fig_memory_waste" / "points").iterdir()}
    build("memory_waste", figures_dir=root / "figures", runs_dir=root / "runs", executor=LocalExecutor(1),
          progress=False, command="again", spec=parse_spec(SPECS["memory_waste"], default_name="memory_waste"))
    after = {p.name: p.stat().st_mtime_ns for p in (root / "runs" / "fig_memory_waste" / "points").iterdir()}
    assert before == after
    assert json.loads((root / "figures" / "memory_waste.provenance.json").read_text())["command"] == "again"


def test_cli_rejects_an_unknown_figure(capsys):
    from workbench.figures.__main__ import main

    with pytest.raises(SystemExit):
        main(["memory_wast"])
    assert "unknown figure 'memory_wast'" in capsys.readouterr().err


def test_every_figure_says_what_it_measured(built):
    for name in FIGURE_NAMES:
        _, summary = built[name]
        fig = draw(name, built[name][0])
        texts = [t.get_text() for t in fig.texts]
        caption = next(t for t in texts if "KV slots" in t)
        assert summary["model"].iloc[0] in caption and "KV slots" in caption
        assert all(f"{int(v):,}" in caption for v in summary["kv_slots"].unique())
        assert "GPU preset a100-40gb" in caption and "clock" in caption and "kernel " in caption
        if (summary["clock"] == "measured").any():
            assert "CPU wall time" in caption
        plt.close(fig)


def test_provenance_records_whether_an_input_was_dirty(tmp_path, monkeypatch):
    import subprocess

    from workbench.figures import build as build_module

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_text("old figure")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(build_module, "REPO_ROOT", tmp_path)
    spec = parse_spec(SPECS["memory_waste"], default_name="memory_waste")
    (tmp_path / "figures" / "a.png").write_text("a rebuilt figure")  # an output: the tree is still clean
    assert build_module.provenance("memory_waste", spec, "pytest")["git_dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert build_module.provenance("memory_waste", spec, "pytest")["git_dirty"] is True


def test_prefix_policies_lines_are_the_summary_beside_the_infinite_cache_bound(built):
    from workbench.figures.prefix_policies import (
        cache_rows,
        coinciding,
        group_label,
        infinite_cache_bound,
        policy_table,
        reference_policy,
    )

    _, summary = built["prefix_policies"]
    fig, axes = figure(built, "prefix_policies")
    workloads = list(dict.fromkeys(summary["workload"]))
    assert len(axes) == 3 * len(workloads) == 6  # a row (hit rate, throughput, policy table) per workload
    rows_all = cache_rows(summary)
    groups = coinciding(rows_all)
    policy = reference_policy(rows_all)
    assert policy == "lru"
    bounds = []
    for workload, hits, speed, cells in zip(workloads, axes[0::3], axes[1::3], axes[2::3], strict=True):
        rows = summary[summary["workload"] == workload]
        assert hits.get_title() == style.workload_label(workload)
        lines = {line.get_label(): line for line in hits.get_lines()}
        drawn = 0
        for group in groups:
            for gib, part in rows[(rows["eviction"] == policy)].groupby("host_cache_gib"):
                label = f"{group_label(group)}, {policy}" + (f" + {gib:g} GiB host tier" if gib else "")
                for strategy in group:  # each strategy of a group has exactly the drawn values
                    mine = part[part["strategy"] == strategy].sort_values("kv_slots")
                    hit_rate = mine["prefix_hit_rate"] + mine["prefix_hit_rate_host"]
                    np.testing.assert_array_equal(lines[label].get_ydata(), hit_rate.to_numpy(dtype=float) * 100)
                drawn += 1
        tiered = rows[rows["host_cache_gib"] > 0]
        assert (tiered["prefix_hit_rate_host"] > 0).any(), "the tiny sweep's host tier serves some hits"
        bound = [line for label, line in lines.items() if label.startswith("infinite cache")]
        assert len(bound) == 1 and len(lines) == drawn + 1 and len(speed.get_lines()) == drawn
        assert bound[0].get_ydata()[0] == pytest.approx(infinite_cache_bound(rows.iloc[0]) * 100)
        bounds.append(bound[0].get_ydata()[0])
        # a bound for runs without preemption (a recomputed request hits its own blocks again), both tiers' hits
        calm = rows[rows["num_preemptions"] == 0]
        calm_hits = (calm["prefix_hit_rate"] + calm["prefix_hit_rate_host"]) * 100
        assert len(calm) and (calm_hits <= bound[0].get_ydata()[0] + 1e-9).all()
        # the table: every policy's device-only hit rate, one cell per capacity, as drawn
        (table,) = cells.tables
        texts = {(r, c): cell.get_text().get_text() for (r, c), cell in table.get_celld().items()}
        device = rows[rows["host_cache_gib"] == 0]
        evictions = list(dict.fromkeys(device["eviction"]))
        sizes = sorted(device["kv_slots"].unique())
        for group_index, group in enumerate(groups):
            for i, eviction in enumerate(evictions):
                row = 1 + group_index * len(evictions) + i
                label = f"{group_label(group)}: {eviction}" if len(groups) > 1 else eviction
                assert texts[(row, -1)] == label
                for j, size in enumerate(sizes):
                    hit = device[(device["strategy"] == group[0]) & (device["eviction"] == eviction)
                                 & (device["kv_slots"] == size)]["prefix_hit_rate"].item()
                    assert texts[(row, j)] == f"{hit * 100:.1f}"
                    assert policy_table(summary).loc[(workload, group_label(group), eviction), size / 1000] == \
                        pytest.approx(hit * 100, rel=1e-12)
    assert bounds[0] != bounds[1], "each row is drawn against its own workload's bound"
    plt.close(fig)


def test_prefix_policies_draws_coinciding_caches_once_and_says_so(built):
    from workbench.figures.prefix_policies import caption_note, coinciding, plot

    _, summary = built["prefix_policies"]
    # radix's points made equal to paged-prefix's: one series, named by both, in the caption too
    twin = summary[summary["strategy"] == "paged-prefix"].assign(strategy="radix")
    same = pd.concat([summary[summary["strategy"] == "paged-prefix"], twin], ignore_index=True)
    assert coinciding(same.assign(hit_rate=same["prefix_hit_rate"], host_gib=same["host_cache_gib"])) == \
        [["paged-prefix", "radix"]]
    note = caption_note(same)
    assert "paged-prefix and radix give identical hit rates and throughput at every point" in note
    with style.figure_style():
        fig = plot(same, Path())
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert "Paged + prefix cache = Radix tree (SGLang), lru" in labels
    assert not [label for label in labels if label.startswith("Radix")]
    plt.close(fig)
    # one point apart: two series again
    differ = same.copy()
    differ.loc[differ.index[-1], "throughput_tok_s"] += 1.0
    assert coinciding(differ.assign(hit_rate=differ["prefix_hit_rate"], host_gib=differ["host_cache_gib"])) == \
        [["paged-prefix"], ["radix"]]
    note = caption_note(differ)
    assert "identical" not in note
    # ... whose lines nearly coincide: both drawn, the lower one wider, and the caption says by how much
    gap = 1.0 / differ.loc[differ.index[-1], "throughput_tok_s"] * 100
    assert "'Paged + prefix cache' (wide) lies under 'Radix tree (SGLang)'" in note
    assert f"less than 0.01 points of hit rate and at most {gap:.2f}% of throughput" in note
    with style.figure_style():
        fig = plot(differ, Path())
    widths = {line.get_label(): line.get_linewidth() for line in fig.axes[0].get_lines()}
    assert widths["Paged + prefix cache, lru"] > widths["Radix tree (SGLang), lru"]
    plt.close(fig)
    # hit rates far apart: no overlap over the whole figure, but the throughput panels, where the lines still
    # nearly coincide, say so each
    far = differ.assign(prefix_hit_rate=differ["prefix_hit_rate"].where(differ["strategy"] == "paged-prefix", 0.0))
    note = caption_note(far)
    assert "points of hit rate and" not in note and "in the hit rate of" not in note
    panels = [line for line in note.split("\n") if " in the throughput of " in line]
    assert len(panels) == far["workload"].nunique(), note
    assert all(line.startswith("'Paged + prefix cache' (wide) lies under 'Radix tree (SGLang)'") for line in panels)


def test_every_figure_keeps_the_figure_rules_and_carries_its_caption_line(built):
    """Short legends and coinciding series drawn once (tests/figures/figure_rules.py, which the notebooks'
    figures keep too), and the caption line."""
    from workbench.figures.caption import caption_line

    for name in FIGURE_NAMES:
        _, summary = built[name]
        fig = draw(name, built[name][0])
        assert not figure_problems(fig), (name, figure_problems(fig))
        assert caption_line(summary) in [t.get_text().split("\n")[0] for t in fig.texts], name
        plt.close(fig)


def test_block_size_never_joins_page_sized_points(built):
    fig, axes = figure(built, "block_size")
    page_sized = [line for ax in axes for line in ax.get_lines()
                  if line.get_label().startswith(style.strategy_label("virtual-contiguous"))]
    assert len(page_sized) == 2 * len(axes)  # one per workload in each panel
    assert all(line.get_linestyle() == "None" for line in page_sized)  # markers only
    vattn = [t.get_text() for ax in axes for t in ax.texts]
    assert "4 KiB" in vattn and "8 KiB" in vattn  # each page-sized point says its page size
    plt.close(fig)


def test_hybrid_lines_are_the_summary(built):
    _, summary = built["hybrid"]
    fig, axes = figure(built, "hybrid")
    for ax, key in zip(axes[2:], ("mean_batch_size", "throughput_tok_s"), strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"--hybrid on", "--hybrid off"}
        for hybrid in ("on", "off"):
            rows = summary[summary["hybrid"] == hybrid].sort_values("kv_gib")
            np.testing.assert_array_equal(lines[f"--hybrid {hybrid}"].get_xdata(), rows["kv_gib"])
            np.testing.assert_array_equal(lines[f"--hybrid {hybrid}"].get_ydata(), rows[key])
    on = summary[summary["hybrid"] == "on"].sort_values("kv_gib")["mean_batch_size"].to_numpy()
    off = summary[summary["hybrid"] == "off"].sort_values("kv_gib")["mean_batch_size"].to_numpy()
    assert (on > off).all(), "window layers free blocks: the same pool holds more sequences"
    plt.close(fig)


def test_hybrid_memory_panels_are_the_allocator(built):
    """Top row: per group, the KV the allocator holds for one request; a window group stops growing at
    its window, the full group grows with the context, and `--hybrid off` holds the whole model's."""
    from workbench.figures.hybrid import MEMORY_CONTEXTS, MEMORY_MODELS
    from workbench.presets import MODELS

    fig, axes = figure(built, "hybrid")
    for ax, name in zip(axes[:2], MEMORY_MODELS, strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        model = MODELS[name]
        window = next(g for g in model.layer_groups if g.window_tokens is not None)
        full = next(g for g in model.layer_groups if g.window_tokens is None)
        w = lines[f"on: {window.num_layers} layers, window {window.window_tokens}"].get_ydata()
        f = lines[f"on: {full.num_layers} layers, full"].get_ydata()
        on, off = lines["on: total"].get_ydata(), lines["off: every layer full"].get_ydata()
        np.testing.assert_array_equal(lines["on: total"].get_xdata(), MEMORY_CONTEXTS)
        assert np.all(w == w[0]), "every context here reaches the window: the window group holds one window"
        np.testing.assert_allclose(f / f[0], np.array(MEMORY_CONTEXTS) / MEMORY_CONTEXTS[0])
        np.testing.assert_allclose(on, w + f)
        np.testing.assert_allclose(off * full.num_layers / model.num_layers, f)  # same bytes per layer-token
        assert (on <= off).all() and on[-1] < off[-1]  # equal while the context fits in the window
    plt.close(fig)


def test_kv_layouts_bars_are_the_presets_and_the_runs(built):
    from workbench.figures.kv_layouts import step_read_bytes
    from workbench.presets import MODELS

    _, summary = built["kv_layouts"]
    fig, (per_token, slots, reads) = figure(built, "kv_layouts")
    models = list(summary["model"])
    heights = [p.get_height() for p in per_token.patches]
    assert heights == pytest.approx([MODELS[m].kv_bytes_per_token("fp16") / 1024 for m in models], rel=1e-12)
    assert [p.get_height() for p in slots.patches] == pytest.approx(list(summary["kv_slots"] / 1e6), rel=1e-12)
    lines = {line.get_label(): line for line in reads.get_lines()}
    assert set(lines) == {"MHA", "MLA", "MLA + DSA"}
    sparse = lines["MLA + DSA"]
    context = int(sparse.get_xdata()[-1])
    # past the top-k, a sparse step reads every indexer key and 2,048 latent rows
    expected = 61 * (132 * context + 2048 * 1152)
    assert sparse.get_ydata()[-1] * 2**20 == pytest.approx(expected, rel=1e-12)
    assert step_read_bytes("deepseek-v3.2", context) == pytest.approx(expected, rel=1e-12)
    assert lines["MLA"].get_ydata()[-1] * 2**20 == pytest.approx(27 * 1152 * context, rel=1e-12)
    plt.close(fig)


def test_recurrent_state_lines_are_the_summary(built):
    from workbench.figures.recurrent_state import ATTENTION_LABEL, NONE_LABEL, pool_gib

    sweep_dir, summary = built["recurrent_state"]
    fig, axes = figure(built, "recurrent_state")
    workloads = list(dict.fromkeys(summary["workload"]))
    assert len(axes) == 3 * len(workloads)  # a row (hit rate, TTFT p95, throughput) per workload
    hybrid = summary[summary["model"] == "qwen3.5-0.8b"]
    pool = pool_gib(hybrid.iloc[0])
    p95 = pd.Series({p: ttft_percentile(sweep_dir, p, 95) for p in summary["point_id"]})
    for workload, row in zip(workloads, np.reshape(axes, (len(workloads), 3)), strict=True):
        points = summary[summary["workload"] == workload]
        for ax, (key, scale) in zip(row, [("prefix_hit_rate", 100.0), ("ttft_p95_s", 1.0),
                                          ("throughput_tok_s", 1e-3)], strict=True):
            def value(rows, key=key, scale=scale):
                return (p95[rows["point_id"]].to_numpy() if key == "ttft_p95_s" else rows[key].to_numpy()) * scale

            for strategy in ("paged-prefix", "radix"):
                for policy in ("align", "all", "tree", "marconi"):
                    (line,) = [ln for ln in ax.get_lines() if f"{policy}, {strategy}" in ln.get_label().split(" = ")]
                    rows = points[(points["strategy"] == strategy) & (points["state_checkpoints"] == policy)]
                    rows = rows.assign(gib=rows["state_cache_gib"].fillna(pool)).sort_values("gib")
                    budgets = [0.05, pool] if strategy == "paged-prefix" else [pool]
                    np.testing.assert_allclose(line.get_xdata(), budgets, rtol=1e-12)
                    np.testing.assert_allclose(line.get_ydata(), value(rows), rtol=1e-12)
            for label, rows in ((NONE_LABEL, points[(points["model"] == "qwen3.5-0.8b")
                                                   & (points["state_checkpoints"] == "none")]),
                                (ATTENTION_LABEL, points[points["model"] != "qwen3.5-0.8b"])):
                (line,) = [ln for ln in ax.get_lines() if f"{label}, paged-prefix" in ln.get_label().split(" = ")]
                np.testing.assert_allclose(line.get_ydata(), value(rows)[[0, 0]], rtol=1e-12)
    assert (hybrid.loc[hybrid["state_checkpoints"] == "none", "prefix_hit_rate"] == 0).all(), \
        "without checkpoints a hybrid's prefix never hits: the state where it ends is gone"
    shared = hybrid[hybrid["workload"].str.startswith("system-prompt") & (hybrid["state_checkpoints"] == "marconi")]
    assert (shared["prefix_hit_rate"] > 0).all(), "marconi checkpoints the shared system prompts' branch points"
    assert [t.get_text() for t in axes[0].get_xticklabels()][-1] == f"pool\n{pool:.3g}"
    plt.close(fig)


def ttft_percentile(sweep_dir: Path, point_id: str, q: float) -> float:
    """The q-th percentile of TTFT over a point's finished requests, read here from its request table."""
    requests = pd.read_parquet(sweep_dir / "points" / point_id / "requests.parquet")
    done = requests[requests["status"] == "finished"]
    return float(np.percentile(done["first_token_s"] - done["arrival_s"], q))


def test_recurrent_state_p95_is_taken_as_the_summary_takes_p50_and_p99(built):
    sweep_dir, summary = built["recurrent_state"]
    for row in summary.itertuples():
        assert ttft_percentile(sweep_dir, row.point_id, 50) == pytest.approx(row.ttft_p50_s, rel=1e-12)
        assert ttft_percentile(sweep_dir, row.point_id, 99) == pytest.approx(row.ttft_p99_s, rel=1e-12)
