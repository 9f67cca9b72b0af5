"""The login-node side of grpo-submit: preflight checks, the job's rendering and submission
through submitit, the per-node launcher, and starting a run's next attempt. No torch.
"""
