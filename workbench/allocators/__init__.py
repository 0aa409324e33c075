"""Allocator strategies behind one protocol (DESIGN §4)."""
