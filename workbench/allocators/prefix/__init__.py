"""Prefix caching: indexes of cached blocks (hash chains, radix tree), eviction orders and a host
tier (docs/strategies.md)."""
