# Sourced by the GPU scripts (gpu_session.sh, issue38_probe.sh) on a lent GPU machine, from
# the repository root: the wheels the machine lacks (.whl/, see gpu_real_prep.sh) into
# /tmp/site, the import path, quiet offline libraries, and NVLink multicast off in this
# process and every one it starts (a program using multicast can take a shared host's GPUs
# out of service). GPUS (e.g. 2,3) keeps this script's runs to those GPUs, so that two 2-GPU
# runs can share a 4-GPU machine side by side.
if compgen -G ".whl/*.whl" >/dev/null; then
    # each carried wheel installed once per machine (a later call may carry more), under a
    # lock: two scripts sourcing this side by side must not write /tmp/site at once
    mkdir -p /tmp/site/.wheels
    (
        flock 9
        new=()
        for w in .whl/*.whl; do [ -f "/tmp/site/.wheels/${w##*/}" ] || new+=("$w"); done
        if ((${#new[@]})); then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target /tmp/site "${new[@]}" || exit 1
            for w in "${new[@]}"; do touch "/tmp/site/.wheels/${w##*/}"; done
        fi
    ) 9>/tmp/site.lock || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error WANDB_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -n "${GPUS:-}" ]; then export CUDA_VISIBLE_DEVICES=$GPUS; fi
