"""Fault campaigns: faults injected into real runs on Slurm, CPU and GPU, and the recovery judged."""
