"""The vLLM paper's evaluation (Kwon et al., SOSP 2023) reproduced number by number.

`python -m workbench.paper` runs the `experiments/paper_*.yaml` sweeps and prints one table: the
paper's value (from `values.yaml`, with its figure or section) beside the workbench's and the
difference, with the experiment behind each row and, outside the tolerance, the reason for the gap.
"""
