"""Attention and KV-cache kernels behind one validated surface (DESIGN §7)."""
