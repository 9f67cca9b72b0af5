"""The learning benchmark: grpo_hpc against TRL on one task, seeds, accuracy curves."""
