"""Allocator strategies behind one protocol (docs/strategies.md)."""
