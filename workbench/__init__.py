"""KV Workbench: measure KV-cache memory management strategies on real traces with real kernels."""

__version__ = "0.1.0"
