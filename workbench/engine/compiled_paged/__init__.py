"""A plain run's whole step loop in compiled code (docs/performance.md, docs/engine.md).

A run whose every step is the plain case — `paged` without a prefix cache or tiers, `paged-prefix` under LRU
without tiers, or `virtual-contiguous` without a host pool; no kernels, whole
prefills, first-come-first-served admission, preemption by recompute, one sequence per request, the
roofline clock — spends its time in the Python calls between scheduler, strategy, meter and clock, not in
their work. `eligible.applies` says whether a replica's run is such a run; `drive.drive` then runs it with
`step_loop.run_steps`, which makes the same decisions on arrays, and hands the same rows to the same
sinks. Every other run takes the general loop (`simulation._drive`). Tests run both loops on the same
workloads and compare the tables value for value.
"""
