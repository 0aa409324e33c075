"""Paged strategies: PagedAttention's block tables, one per sequence or one per layer group
(docs/strategies.md, docs/hybrid.md)."""
