"""The ground floor both sides stand on: exit codes and errors, atomic writes, the run
directory's file names, the progress file, checkpoint manifests, the Slurm queries and
finding runs. Imports nothing else of grpo_hpc and no torch.
"""
