"""The run table: the figures of one run's summary people look at first, as text (the CLI) or HTML (a
notebook cell)."""

from __future__ import annotations

import html
import math
from typing import Any


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) rows of the run table, values formatted; a fleet's and a tiered cache's rows only
    where they apply."""
    rows = [
        ("kernel backend", summary["kernel_backend"]),
        ("kv slots", summary["kv_slots"]),
        ("requests finished / rejected", f"{summary['num_finished']} / {summary['num_rejected']}"),
        ("simulated time (s)", summary["sim_time_s"]),
        ("throughput (req/s, tok/s)", f"{summary['throughput_req_s']:.3f}, {summary['throughput_tok_s']:.1f}"),
        ("normalized latency (s/token)", summary["normalized_latency_s_per_tok"]),
        ("TTFT p50 / p99 (s)", f"{summary['ttft_p50_s']:.4g} / {summary['ttft_p99_s']:.4g}"),
        ("TPOT p50 / p99 (s)", f"{summary['tpot_p50_s']:.4g} / {summary['tpot_p99_s']:.4g}"),
        ("mean / max batch (seqs)", f"{summary['mean_batch_size']:.1f} / {summary['max_batch_size']}"),
        ("saturated steps: frac, batch, tok/s",
         f"{summary['saturated_step_frac']:.3f}, {summary['mean_batch_size_sat']:.1f}, "
         f"{summary['throughput_tok_s_sat']:.1f}"),
        ("memory token / reserved / internal / cached / external / free",
         " / ".join(f"{summary[k]:.3f}" for k in ("mem_token_frac", "mem_reserved_frac", "mem_internal_frag_frac",
                                                   "mem_cached_frac", "mem_external_frag_frac", "mem_free_frac"))),
        ("sharing saving (token, block)",
         f"{summary['sharing_saving_frac']:.3f}, {summary['block_sharing_saving_frac']:.3f}"),
        ("prefix hit rate", summary["prefix_hit_rate"]),
        ("preemptions / cow copies", f"{summary['num_preemptions']} / {summary['cow_copies']}"),
        *([("state live / checkpoints, saved / evicted / hit",
            f"{summary['mem_state_frac']:.3f} / {summary['mem_state_checkpoint_frac']:.3f}, "
            f"{summary['state_checkpoints_saved']} / {summary['state_checkpoints_evicted']} / "
            f"{summary['state_checkpoint_hits']}")]
          if "mem_state_frac" in summary else []),
        *([("speculative: drafts accepted, tokens per step",
            f"{summary['spec_accept_rate']:.3f}, {summary['spec_tokens_per_step']:.3f}")]
          if "spec_accept_rate" in summary else []),
        ("verify max rel err", summary["verify_max_rel_err"]),
        ("wall time (s)", summary["sim_wall_s"]),
    ]
    tiers = [(name, summary[f"prefix_hit_rate_{tier}"], summary[f"{tier}_bytes_loaded"],
              summary[f"{tier}_bytes_demoted"]) for tier, name in (("host", "host tier"), ("shared", "shared tier"))
             if summary[f"{tier}_bytes_demoted"]]  # a prefix cache's host tier, a fleet's shared tier, if used
    at = [name for name, _ in rows].index("prefix hit rate") + 1
    rows[at:at] = [(f"{name}: hit rate, GB loaded / demoted", f"{rate:.4g}, {loaded / 1e9:.4g} / {demoted / 1e9:.4g}")
                   for name, rate, loaded, demoted in tiers]
    if "replicas" in summary:  # a fleet: kv slots and memory are per replica, requests and latency the fleet's
        rows = [("kv slots per replica", value) if name == "kv slots" else (name, value) for name, value in rows]
        rows.insert(1, ("replicas, router, load imbalance (max/mean)",
                        f"{summary['replicas']}, {summary['router']}, {summary['load_imbalance']:.3f}"))
        if summary["kv_transfer_bytes"]:  # disaggregated prefill/decode
            rows.insert(2, ("KV shipped prefill -> decode (GB)", f"{summary['kv_transfer_bytes'] / 1e9:.4g}"))
    return [(name, _formatted(value)) for name, value in rows]


def _formatted(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """A short two-column table of the figures people look at first."""
    rows = summary_rows(summary)
    width = max(len(name) for name, _ in rows)
    table = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    return table + saturation_note(summary["saturated_step_frac"])


def html_summary(title: str, summary: dict[str, Any]) -> str:
    """The run table as an HTML table under `title`, for a notebook cell."""
    body = "".join(f"<tr><th style='text-align:left'>{html.escape(name)}</th><td style='text-align:left'>"
                   f"{html.escape(value)}</td></tr>" for name, value in summary_rows(summary))
    note = saturation_note(summary["saturated_step_frac"]).strip()
    tail = f"<p><em>{html.escape(note)}</em></p>" if note else ""
    return f"<div><strong>{html.escape(title)}</strong><table>{body}</table>{tail}</div>"


def dropped_rows_note(workload: str, summary: dict[str, Any]) -> str | None:
    """The line a run says on stderr when its trace reader dropped failed rows (None when it dropped none):
    a changed workload is never silent."""
    dropped = summary["num_failed_rows_dropped"]
    if not dropped:
        return None
    return (f"note: {workload}: dropped {dropped:,} failed trace rows (0 output tokens); failed=keep replays them "
            f"(summary: num_failed_rows_dropped)")


# below this fraction of steps with a queue, the run says little about a memory-bound batch
UNSATURATED_STEP_FRAC = 0.5


def saturation_note(saturated_step_frac: float) -> str:
    """One line when the queue was mostly empty: the batch was limited by arrivals, not by KV memory."""
    if saturated_step_frac >= UNSATURATED_STEP_FRAC:
        return ""
    return (f"\nnote: requests queued in only {saturated_step_frac:.0%} of steps: arrivals, not KV memory, "
            f"limited the batch (raise --rate to measure the saturated window)")
