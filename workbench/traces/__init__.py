"""The public trace registry: names, checksums, licences, published sources, and a verified fetch into a
local cache."""

from workbench.traces.registry import TRACES, TraceEntry, get_trace
from workbench.traces.store import cache_dir, fetch, locate, resolve

__all__ = ["TRACES", "TraceEntry", "cache_dir", "fetch", "get_trace", "locate", "resolve"]
