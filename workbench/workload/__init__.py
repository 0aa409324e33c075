"""Workloads: the request type, synthetic generators, trace readers and transforms (DESIGN §5)."""

from workbench.workload.request import Request, Segment, content_token_ids, output_key, token_ids_for

__all__ = ["Request", "Segment", "content_token_ids", "output_key", "token_ids_for"]
