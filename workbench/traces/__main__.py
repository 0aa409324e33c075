"""`python -m workbench.traces list` and `python -m workbench.traces fetch NAME [--url URL]`.

Traces are looked up in the cache ($WORKBENCH_TRACE_CACHE, default ~/.cache/kv-workbench/traces), then in
the shared traces folder ($WORKBENCH_SHARED_TRACES, else ../shared/traces beside the checkout or the
working directory), then fetched from their published URL and verified.
"""

from __future__ import annotations

import argparse
import sys

from workbench.clean_exit import OneLineParser, print_error, run_cli
from workbench.errors import TraceError
from workbench.paths import shared_traces_dir
from workbench.traces.registry import TRACES
from workbench.traces.store import cache_dir, cached_path, fetch, shared_path


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.traces", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="known traces, their licence, size and where each is available")
    fetch_parser = sub.add_parser("fetch", help="download a trace into the cache and verify its sha256")
    fetch_parser.add_argument("name", metavar="NAME", help=", ".join(sorted(TRACES)))  # fetch names an unknown one
    fetch_parser.add_argument("--url", help="download the published file from this URL instead (a mirror)")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(f"cache:  {cache_dir()}")
        print(f"shared: {shared_traces_dir() or '(none)'}")
        print(f"{'name':<36} {'format':<9} {'rows':>7} {'size':>9}  {'here':<6} {'fetch':<8} licence")
        for entry in TRACES.values():
            here = "cache" if cached_path(entry).is_file() else "shared" if shared_path(entry) else "-"
            how = "derive" if entry.derive else "as-is"
            size = f"{entry.size_bytes / 1e6:>7.2f}MB" if entry.size_bytes else f"{'?':>7}MB"
            print(f"{entry.name:<36} {entry.format or '-':<9} {entry.rows:>7,} {size}  "
                  f"{here:<6} {how:<8} {entry.licence}")
        print("every trace can be fetched: python -m workbench.traces fetch NAME "
              "(as-is: the published file; derive: derived from it and verified)")
        return 0
    try:
        path = fetch(args.name, url=args.url)
    except TraceError as exc:
        print_error(exc)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
