"""Fault campaigns: faults injected into real runs on Slurm (CPU, GPU), recovery judged."""
