"""`python -m workbench.traces list` and `python -m workbench.traces fetch NAME [--url URL]`."""

from __future__ import annotations

import argparse
import sys

from workbench.errors import TraceError
from workbench.traces.registry import TRACES
from workbench.traces.store import cache_dir, cached_path, fetch, shared_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.traces", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="known traces and where each is available")
    fetch_parser = sub.add_parser("fetch", help="download a trace into the cache and verify its sha256")
    fetch_parser.add_argument("name", choices=sorted(TRACES), metavar="NAME")
    fetch_parser.add_argument("--url", help="download from this URL instead of the registry's (a mirror)")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(f"cache: {cache_dir()}")
        print(f"{'name':<36} {'format':<9} {'rows':>7}  {'available':<19} licence")
        for entry in TRACES.values():
            where = [w for w, ok in (("cache", cached_path(entry).is_file()), ("shared", shared_path(entry)),
                                     ("url", entry.url)) if ok]
            print(f"{entry.name:<36} {entry.format or '-':<9} {entry.rows:>7,}  {', '.join(where) or 'nowhere':<19} "
                  f"{entry.licence}")
        return 0
    try:
        path = fetch(args.name, url=args.url)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
