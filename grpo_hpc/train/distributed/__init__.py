"""The ranks: process group, model wrapping, agreement between ranks (dist.py), each rank's
CPUs (cpu_binding.py) and its GPU as every decision sees it (gpu.py)."""
