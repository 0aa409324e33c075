"""vAttention's virtually contiguous extents with physical pages mapped on demand (docs/strategies.md)."""
