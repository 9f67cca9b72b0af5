"""grpo_hpc beside TRL: side by side steps, multi-GPU TRL, and the update's parity."""
