"""The login-node side of grpo-submit: preflight checks, the submission plan, and carrying
it out through submitit (the per-node launcher it hands over is grpo_hpc.node's). No torch.
"""
