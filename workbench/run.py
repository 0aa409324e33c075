"""`python -m workbench.run`: one simulation run (docs/outputs.md).

The argument parser is generated from RunConfig's fields (their metadata is the help text, with
units), so a flag exists exactly when a config key does: `--kv-gib` is `kv_gib`. A bad
configuration, or an `--out` that holds results (without `--force`) or cannot be created, is one
line on stderr and exit status 2 before anything runs; nothing is written. So is a workload none of
whose requests the configuration could serve (found once the workload is read, before simulating).
Ctrl-C or SIGTERM exits 130, writing nothing; a failing stdout keeps the written result.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path

from workbench.clean_exit import OneLineParser, print_error, run_cli
from workbench.config import RunConfig, describe_bounds
from workbench.errors import TraceError, UnservableError, WorkloadError
from workbench.outdir import OutputExistsError, check_target, install, staging_dir
from workbench.presets import GPUS, MODELS

_TYPES = {"int": int, "float": float, "str": str}


def _field_type(annotation: str):
    base = annotation.replace(" | None", "").strip()
    return _TYPES[base]


def _known_names() -> dict[str, str]:
    """The registered names a user picks from, shown in --help beside their flags."""
    from workbench.allocators import registry

    return {"strategy": ", ".join(registry.names()), "model": ", ".join(MODELS), "gpu": ", ".join(GPUS)}


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workbench.run", description=__doc__.splitlines()[0])
    known = _known_names()
    for f in dataclasses.fields(RunConfig):
        help = f.metadata["help"]
        if f.name in known:
            help += f"; one of: {known[f.name]}"
        if f.default is not None and "default" not in help:
            help += " (default: %(default)s)"
        if describe_bounds(f):
            help += f" [{describe_bounds(f)}]"
        if f.type == "bool":  # a switch: present means on
            kwargs = {"action": "store_true", "help": f.metadata["help"]}
        else:
            kwargs = {"type": _field_type(str(f.type)), "default": f.default, "help": help}
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write config.json, steps.parquet, requests.parquet and summary.json here "
                             "(a new directory, renamed into place when complete)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out; the old one is removed only once the new one is in place")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    return parser


def format_summary(summary: dict) -> str:
    """A short two-column table of the figures people look at first."""
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
        ("verify max rel err", summary["verify_max_rel_err"]),
        ("wall time (s)", summary["sim_wall_s"]),
    ]
    tiers = [(name, summary[f"prefix_hit_rate_{tier}"], summary[f"{tier}_bytes_loaded"],
              summary[f"{tier}_bytes_demoted"]) for tier, name in (("host", "host tier"), ("shared", "shared tier"))
             if summary[f"{tier}_bytes_demoted"]]  # a prefix cache's host tier, a fleet's shared tier, if used
    at = rows.index(("prefix hit rate", summary["prefix_hit_rate"])) + 1
    rows[at:at] = [(f"{name}: hit rate, GB loaded / demoted", f"{rate:.4g}, {loaded / 1e9:.4g} / {demoted / 1e9:.4g}")
                   for name, rate, loaded, demoted in tiers]
    if "replicas" in summary:  # a fleet: kv slots and memory are per replica, requests and latency the fleet's
        rows = [("kv slots per replica", value) if name == "kv slots" else (name, value) for name, value in rows]
        rows.insert(1, ("replicas, router, load imbalance (max/mean)",
                        f"{summary['replicas']}, {summary['router']}, {summary['load_imbalance']:.3f}"))
        if summary["kv_transfer_bytes"]:  # disaggregated prefill/decode
            rows.insert(2, ("KV shipped prefill -> decode (GB)", f"{summary['kv_transfer_bytes'] / 1e9:.4g}"))
    width = max(len(name) for name, _ in rows)

    def fmt(value) -> str:
        if isinstance(value, float):
            return "nan" if math.isnan(value) else f"{value:.4g}"
        return str(value)

    table = "\n".join(f"{name:<{width}}  {fmt(value)}" for name, value in rows)
    return table + saturation_note(summary["saturated_step_frac"])


# below this fraction of steps with a queue, the run says little about a memory-bound batch
UNSATURATED_STEP_FRAC = 0.5


def saturation_note(saturated_step_frac: float) -> str:
    """One line when the queue was mostly empty: the batch was limited by arrivals, not by KV memory."""
    if saturated_step_frac >= UNSATURATED_STEP_FRAC:
        return ""
    return (f"\nnote: requests queued in only {saturated_step_frac:.0%} of steps: arrivals, not KV memory, "
            f"limited the batch (raise --rate to measure the saturated window)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    values = {name: getattr(args, name) for name in RunConfig.field_names()}
    from workbench.engine.simulation import check_config, run
    try:
        cfg = RunConfig(**values)
        check_config(cfg)
        if args.out is not None:
            args.out = check_target(args.out, replace=args.force)  # before simulating, not after
    except ValueError as exc:
        print_error(exc)
        return 2
    staged = None if args.out is None else staging_dir(args.out)  # renamed to --out once complete
    keep_staged = False
    try:
        summary = run(cfg, staged, progress=args.progress)
        if staged is not None:
            install(staged, args.out, replace=args.force)
    except OutputExistsError as exc:  # --out appeared while running: the message names where the result is
        keep_staged = True
        print_error(exc)
        return 2
    except (WorkloadError, TraceError, UnservableError) as exc:  # found once the run has read its workload
        print_error(exc)
        return 2
    except OSError as exc:  # a full disk or a vanished parent: the staged directory goes, nothing else changed
        print_error(f"cannot write {args.out}: {exc.strerror or exc}; nothing was written")
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    finally:
        if staged is not None and not keep_staged:
            shutil.rmtree(staged, ignore_errors=True)
    print(f"{cfg.strategy} (block {cfg.block_size}) · {cfg.model} · {cfg.workload}")
    print(format_summary(summary))
    if args.out is not None:
        print(f"wrote {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
