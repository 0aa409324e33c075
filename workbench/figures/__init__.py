"""Figures (docs/outputs.md): one experiment YAML + one plotting function each, built from sweep summaries."""
