"""Checkpoints leaving the run: grpo-export (plan -> sources -> write, each layer importing
only those below) and grpo-ckpt (listing and verifying checkpoints).
"""
