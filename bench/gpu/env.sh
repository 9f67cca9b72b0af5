# Sourced by bench/gpu.sh before a subject's stage file: the helpers every GPU stage shares.
# Run from the repository root on a lent GPU machine.
#   nvls_off        NVLink multicast off in this process and every one it starts (a program
#                   using multicast can take a shared host's GPUs out of service)
#   quiet_offline   unbuffered output, offline hub, quiet transformers, no wandb
#   install_wheels  the wheels the machine lacks (.whl/, see `bench/gpu.sh prep`) into
#                   /tmp/site, each once per machine, and the import path
#   device_env      all three, and GPUS (e.g. 2,3) keeping the runs to those GPUs, so that two
#                   2-GPU runs can share a 4-GPU machine side by side
# The SmolLM2 GGUF travels in this many parts, one a call (`bench/gpu.sh prep` cuts them,
# `bench/gpu.sh real ... model` joins them): the tracked tree travels with every call too
# (36 MiB on 2026-12-05, 41 MiB in disk blocks on 2026-12-06, most of it bench/results): a
# third of the GGUF beside it passed the 64 MiB a call carries, then a quarter (65 MiB)
GGUF_PARTS=5
nvls_off() {
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}
quiet_offline() {
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error WANDB_MODE=disabled
}
install_wheels() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        # each carried wheel installed once per machine (a later call may carry more), under
        # a lock: two stages side by side must not write /tmp/site at once
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
    elif [ -d /tmp/site ]; then
        # installed by an earlier call on this held machine: a call carrying a GGUF part
        # has no room for .whl too (64 MiB), and still needs them
        export PYTHONPATH=/tmp/site:$PWD
    else
        export PYTHONPATH=$PWD
    fi
}
device_env() {
    install_wheels
    quiet_offline
    nvls_off
    if [ -n "${GPUS:-}" ]; then export CUDA_VISIBLE_DEVICES=$GPUS; fi
}
