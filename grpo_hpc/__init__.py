"""grpo_hpc: Slurm-native GRPO training for language models."""

__version__ = "0.1.0"
