"""Held-out evaluation: generating and judging a held-out set, pass@k (scoring.py, shared
with grpo-eval), and the trainer's run of it during training (held_out.py)."""
