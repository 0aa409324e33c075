"""`python -m workbench.workload describe SPEC [...]`: summarize a workload before simulating it."""

from __future__ import annotations

import sys

from workbench.clean_exit import OneLineParser, print_error, run_cli
from workbench.config import RunConfig
from workbench.errors import WorkloadError
from workbench.workload.build import load_workload
from workbench.workload.describe import DEFAULT_BLOCK_SIZE, describe


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.workload")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("describe", help="requests, time span, rates, length percentiles, prefix sharing")
    cmd.add_argument("spec", metavar="SPEC", help="synthetic NAME[:k=v,...] or FORMAT:PATH[:k=v,...]")
    cmd.add_argument("--rate", type=float, help="requests/s (synthetic arrivals; rescales a trace)")
    cmd.add_argument("--num-requests", type=int, help="cap on the number of requests")
    cmd.add_argument("--duration", type=float, help="time window in seconds from the first arrival")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--max-model-len", type=int, help="default: the model preset's")
    cmd.add_argument("--model", default=RunConfig.model, help="model preset (for its max_model_len)")
    cmd.add_argument("--n", type=int, default=1, help="parallel samples per request")
    cmd.add_argument("--beam-width", type=int, default=1)
    cmd.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                     help=f"block size of the prefix-sharing potential (default {DEFAULT_BLOCK_SIZE})")
    args = parser.parse_args(argv)
    try:
        if args.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
        cfg = RunConfig(workload=args.spec, rate=args.rate, num_requests=args.num_requests, duration=args.duration,
                        seed=args.seed, max_model_len=args.max_model_len, model=args.model, n=args.n,
                        beam_width=args.beam_width)
        print(describe(load_workload(cfg), args.block_size))
    except (WorkloadError, ValueError) as exc:
        print_error(exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
