"""The public trace registry: names, checksums, licences, published sources, and a verified fetch into a
local cache."""

from workbench.callable_module import make_callable
from workbench.traces.registry import TRACES, TraceEntry, get_trace
from workbench.traces.store import cache_dir, fetch, locate, resolve

__all__ = ["TRACES", "TraceEntry", "cache_dir", "fetch", "get_trace", "locate", "resolve"]

make_callable(__name__, "workbench.api:traces")  # `workbench.traces()` is workbench.api.traces
