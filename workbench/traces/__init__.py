"""The public trace registry: names, checksums, licences, and a verified fetch into a local cache."""

from workbench.traces.fetch import cache_dir, fetch, resolve
from workbench.traces.registry import TRACES, TraceEntry, get_trace

__all__ = ["TRACES", "TraceEntry", "cache_dir", "fetch", "get_trace", "resolve"]
