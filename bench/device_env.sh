# Sourced by the GPU scripts (gpu_session.sh, issue38_probe.sh) on a lent GPU machine, from
# the repository root: the wheels the machine lacks (.whl/, see gpu_real_prep.sh) into
# /tmp/site, the import path, quiet offline libraries, and NVLink multicast off in this
# process and every one it starts (a program using multicast can take a shared host's GPUs
# out of service).
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error WANDB_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
