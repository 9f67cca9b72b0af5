"""GRPO training: advantages, losses, and the training loop."""
