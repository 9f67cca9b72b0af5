"""grpo-eval: what it scores (target), scoring on this machine (local), or as a one-node job of
a cluster profile (job).
"""
