"""The running trainer's supervision: stop signals (signals.py), each rank's pulse and its
watch on its peers' (liveness.py), circuit breakers (breakers.py), the garbage collector on
a schedule (gc_schedule.py), test-only fault injection (faults.py)."""
