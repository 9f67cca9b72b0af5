"""How fast a step and its parts are: the step, the update, profiles, checkpoints, rewards."""
