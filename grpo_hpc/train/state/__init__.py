"""The trainer's state on disk: checkpoints that count only when complete (checkpoint.py),
room for them (space.py), what the trainer saves in them and resumes from them
(run_state.py), digests of what was saved and resumed (state_digest.py)."""
