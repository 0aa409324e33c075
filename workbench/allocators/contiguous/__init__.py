"""Contiguous strategies: one extent per sequence, placed first-fit, best-fit or buddy (docs/strategies.md)."""
