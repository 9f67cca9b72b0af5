#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=16
#SBATCH --error=/tmp/runs37/slurm-gsm8k-tiny/submitit/%j/%j_0_log.err
#SBATCH --gres=gpu:2
#SBATCH --job-name=grpo-slurm-gsm8k-tiny
#SBATCH --mem=200GB
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/tmp/runs37/slurm-gsm8k-tiny/submitit/%j/%j_0_log.out
#SBATCH --partition=debug
#SBATCH --requeue
#SBATCH --signal=USR2@180
#SBATCH --time=30
#SBATCH --wckey=submitit

# setup
export NCCL_ASYNC_ERROR_HANDLING='1'
export NCCL_DEBUG='INFO'
export NCCL_IB_TIMEOUT='22'
export NCCL_NVLS_ENABLE='0'
export NVSHMEM_DISABLE_NVLS='1'
export OMP_NUM_THREADS='8'
export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'
export TOKENIZERS_PARALLELISM='false'
export TORCH_NCCL_ASYNC_ERROR_HANDLING='1'
export TORCH_SYMM_MEM_DISABLE_MULTICAST='1'
export GRPO_HPC_RUN_DIR='/tmp/runs37/slurm-gsm8k-tiny'
echo "[job env] host=$(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset} $(env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=' | sort | tr '\n' ' ')"

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /tmp/runs37/slurm-gsm8k-tiny/submitit/%j/%j_%t_log.out --error /tmp/runs37/slurm-gsm8k-tiny/submitit/%j/%j_%t_log.err /opt/torch/.venv/bin/python3 -u -m submitit.core._submit /tmp/runs37/slurm-gsm8k-tiny/submitit/%j
