"""The problems a run trains on, read the same way by the login node (preflight) and the
trainer: GSM8K-format rows, code tasks, where a completion's answer is. No torch.
"""
