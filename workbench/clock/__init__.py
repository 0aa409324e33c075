"""How long a step takes: what it computes and moves (`step_cost`), the roofline model of the GPU
(`roofline`) and the clocks a run can choose (`profiles`). docs/engine.md#clocks."""
