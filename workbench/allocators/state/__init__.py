"""Recurrent state beside the KV blocks (docs/recurrent.md): live states and their checkpoints."""
