"""What a running trainer measures and tells: progress, metrics and W&B (tracking.py), each
step's row over the ranks (step_report.py), the profiler window and phase timing
(profiling.py), slow phases' stacks (stall_sampler.py)."""
