"""Figures (DESIGN §9): one experiment YAML + one plotting function each, built from sweep summaries."""
