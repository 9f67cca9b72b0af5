"""The native rollout engine: packed weights, decoder math, CUDA-graph decode loop."""
