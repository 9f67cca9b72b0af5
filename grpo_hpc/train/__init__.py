"""The torchrun target: the GRPO loop (trainer.py; __main__.py its entry point) on top, and
beneath it packages by concern: distributed/ (the ranks), measure/ (what the run measures
and tells), algo/ rollout/ rewards/ (the step's work), state/ (checkpoints on disk),
supervision/ (signals, pulses, breakers, gc, fault injection), evaluation/ (held-out
scoring), setup/ (model loading, auto settings). docs/ARCHITECTURE.md gives their layers."""
