"""Workloads: the request type, synthetic generators, trace readers and transforms (docs/workloads.md)."""

from workbench.workload.build import Workload, build_workload, check_workload, load_workload
from workbench.workload.request import Request, Segment, content_token_ids, output_key, token_ids_for

__all__ = ["Request", "Segment", "Workload", "build_workload", "check_workload", "content_token_ids", "load_workload",
           "output_key", "token_ids_for"]
