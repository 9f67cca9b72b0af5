"""The GRPO algorithm: group-relative advantages, the clipped policy-gradient loss, the fused
log-prob head, packing, micro-batching, the update and the optimizer.
"""
