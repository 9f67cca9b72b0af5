"""Why runs stall (the cap trap), the collapse watch replayed on recorded runs, solved runs."""
