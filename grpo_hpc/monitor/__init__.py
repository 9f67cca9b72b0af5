"""grpo-monitor: the pure decision for one run (decision) and the loop that acts on it (loop)."""
