# Stage file of bench/gpu.sh: on a lent multi-GPU machine (root, no network), the test cluster of
# slurm/up.sh brought up from carried Debian packages with the machine's real GPUs as GRES,
# a --gres=gpu:2 probe job, then a GSM8K run submitted with grpo-submit as a user would
# (bench/slurm-h100x2.yaml: templates/h100x2.yaml on partition debug; sbatch with the GRES,
# srun, torchrun 2 ranks, NCCL, DDP or FSDP2 as the plan picks), watched with squeue and grpo-status.
#
#   bash bench/gpu.sh slurm OUT [STAGE...]      stages: probe up gres submit (default: all)
#
# Needs, next to the checkout or in it (env to override):
#   SLURM_DEBS  folder made by slurm/offline-debs.sh (default ../.slurmdebs, else .slurmdebs)
#   WHEELS      wheels the machine lacks: submitit, omegaconf, antlr4, math-verify,
#               latex2sympy2_extended (default ../.whl37, else .whl37)
# Model: the converted SmolLM2-135M-Instruct when a previous call on this held machine left
# it in /tmp/grpo_cache (`bench/gpu.sh real OUT setup model`), else the random `tiny` model on the
# same GSM8K prompts (GPU_MODEL=tiny|smollm2 forces one; GPU_MODEL=random:DIR runs random
# weights of DIR/config.json with the gsm8k config's own batch and memory plan). GPU_STEPS (6), SUBMIT_TIMEOUT (300 s),
# GPU_PROFILE (another profile, e.g. templates/slurm-local.yaml to try this on a CPU cluster),
# GPU_OVERRIDES (more grpo-submit overrides, e.g. "dist.strategy=fsdp": the profile is DDP first).
# The submit stage ends with python -m bench.speed.step_spread over the run's metrics.
# Every process started here and every Slurm job gets NVLink multicast off. All output files
# end up in OUT/slurm_gpu.tgz (the device tool returns only a few files per call).
set -uo pipefail
nvls_off
OUT=${1:?usage: bash bench/gpu.sh slurm OUT [probe up gres submit]}
shift
STAGES=${*:-probe up gres submit}
mkdir -p "$OUT"
pick() { for d in "$@"; do [[ -d $d ]] && { (cd "$d" && pwd); return; }; done; echo "$1"; }
SLURM_DEBS=${SLURM_DEBS:-$(pick ../.slurmdebs .slurmdebs)}
WHEELS=${WHEELS:-$(pick ../.whl37 .whl37)}
W=/tmp/g37
mkdir -p "$W"
NVLS_RE='^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
ts() { date +%T; }
save_slurm_logs() {
    mkdir -p "$OUT/slurmlogs"
    for f in /var/lib/grpo-slurm/log/*.log; do
        [[ -f $f ]] && tail -n 60 "$f" >"$OUT/slurmlogs/${f##*/}"
    done
}
pack() {
    # the device tool brings back only a few files a call: everything in one tarball
    save_slurm_logs
    tar czf /tmp/slurm_gpu.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete &&
        mv /tmp/slurm_gpu.tgz "$OUT/slurm_gpu.tgz"
}
trap pack EXIT

probe() {
    {
        echo "== os"; head -n 4 /etc/os-release; uname -r; ldd --version | head -n 1
        echo "== python"; python3 --version; command -v python3
        echo "== gpus"; nvidia-smi -L
        echo "== cpu/mem"; nproc; grep MemTotal /proc/meminfo; df -h /tmp | tail -n 1
        echo "== net"; hostname; getent hosts localhost; ip -4 -o addr 2>&1 || hostname -I
        echo "== tools"; for c in ip runuser flock useradd getent objdump file mknod; do
            printf '%s=%s ' "$c" "$(command -v $c || echo MISSING)"; done; echo
        echo "== slurm/munge before"; ls /usr/sbin/slurm* /usr/bin/munge* 2>&1
        echo "== /etc/hosts /etc/protocols"; cat /etc/hosts; ls -la /etc/protocols /etc/services 2>&1
    } >"$OUT/probe.txt" 2>&1
    nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
    cat "$OUT/probe.txt"
}

up() {
    echo "== up.sh --real-gpus from $SLURM_DEBS ($(ts))"
    local t0=$SECONDS
    GRPO_SLURM_DEBS=$SLURM_DEBS bash slurm/up.sh --real-gpus 2>&1 | tee "$OUT/up.log"
    local rc=${PIPESTATUS[0]}
    echo "up.sh rc=$rc in $((SECONDS - t0)) s (cgroup mode ${GRPO_SLURM_CGROUP:-auto})" | tee -a "$OUT/up.log"
    if ((rc)) && grep -qi cgroup /var/lib/grpo-slurm/log/slurmd.log 2>/dev/null; then
        cp /var/lib/grpo-slurm/log/slurmd.log "$OUT/slurmd_first_try.log"
        export GRPO_SLURM_CGROUP=hide
        echo "== slurmd failed on cgroups: again with GRPO_SLURM_CGROUP=hide ($(ts))" | tee -a "$OUT/up.log"
        GRPO_SLURM_DEBS=$SLURM_DEBS bash slurm/up.sh --real-gpus 2>&1 | tee -a "$OUT/up.log"
        rc=${PIPESTATUS[0]}
        echo "up.sh rc=$rc in $((SECONDS - t0)) s (cgroup mode hide)" | tee -a "$OUT/up.log"
    fi
    cp /etc/slurm/cgroup.conf "$OUT/" 2>/dev/null
    cp /var/lib/grpo-slurm/log/offline-install.log "$OUT/" 2>/dev/null
    cp /etc/slurm/slurm.conf /etc/slurm/gres.conf "$OUT/" 2>/dev/null
    sinfo -N -o '%N %P %t %c %m %G' 2>&1 | tee "$OUT/sinfo.txt"
    scontrol show node localhost >"$OUT/node.txt" 2>&1
    # a second call must be the fast path
    GRPO_SLURM_DEBS=$SLURM_DEBS bash slurm/up.sh --real-gpus 2>&1 | tee -a "$OUT/up.log"
    return "$rc"
}

gres() {
    cat >"$W/task.sh" <<'EOF'
#!/bin/bash
echo "task $SLURM_PROCID: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_STEP_GPUS=${SLURM_STEP_GPUS:-} $(env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=' | sort | tr '\n' ' ')"
python3 -c "import os, torch; n = torch.cuda.device_count(); print('task', os.environ['SLURM_PROCID'], 'torch sees', n, 'GPU(s):', [torch.cuda.get_device_name(i) for i in range(n)])"
EOF
    cat >"$W/gres_job.sh" <<EOF
#!/bin/bash
#SBATCH --job-name=gres-probe
#SBATCH --gres=gpu:2
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=2
#SBATCH --mem=8G
#SBATCH --time=5
#SBATCH --output=$W/gres-%j.out
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "batch: host=\$(hostname) SLURM_JOB_GPUS=\${SLURM_JOB_GPUS:-} CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES:-unset}"
env | grep -E '$NVLS_RE' | sort
nvidia-smi -L
srun bash $W/task.sh
EOF
    cp "$W/gres_job.sh" "$OUT/"
    echo "== sbatch --wait gres_job.sh ($(ts))"
    local id
    id=$(timeout 150 sbatch --parsable --wait "$W/gres_job.sh")
    echo "job $id: sbatch --wait rc=$?"
    cat "$W/gres-$id.out" | tee "$OUT/gres_job.out"
    sacct -j "$id" -o JobID,JobName,State,ExitCode,AllocTRES%60 2>&1 | tee "$OUT/gres_sacct.txt"
}

submit() {
    if [[ ! -f /tmp/site37/.installed ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target /tmp/site37 "$WHEELS"/*.whl && touch /tmp/site37/.installed || return 1
    fi
    export PYTHONPATH=/tmp/site37:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled
    export TRANSFORMERS_VERBOSITY=error GRPO_HPC_LOGS=/tmp/runs37
    local model=${GPU_MODEL:-}
    if [[ -z $model ]]; then
        model=tiny
        [[ -f /tmp/grpo_cache/models/smollm2-135m-instruct/config.json ]] && model=smollm2
    fi
    local ov=(model.gradient_checkpointing=false optim.warmup_steps=0
        training.max_steps="${GPU_STEPS:-6}" training.save_every_steps=3
        training.save_every_seconds=0 training.eval_every="${GPU_STEPS:-6}"
        training.zero_reward_patience=0 rollout.num_generations=8 data.num_eval=64
        wandb.mode=disabled)
    if [[ $model == random:* ]]; then
        # a larger shape as a user's gsm8k job plans it (is the plan's memory
        # estimate safe?): the config's own batch, lengths and memory settings, random
        # weights (they run every completion to the length cap: the worst case), no eval;
        # the toy digit-fraction reward varies between random samples, so every step
        # updates (GSM8K's correctness is 0 on random text: no group would train)
        export GRPO_HPC_CACHE=/tmp/grpo_cache37
        ov=(model.name_or_path="$model" training.max_steps="${GPU_STEPS:-3}"
            "reward.custom={grpo_hpc.train.rewards.toy:digit_fraction: 1.0}"
            training.save_every_steps=0 training.save_every_seconds=0 training.save_final=false
            training.export_final=false training.eval_every=0
            training.zero_reward_patience=0 wandb.mode=disabled)
        model=random
    elif [[ $model == smollm2 ]]; then
        export GRPO_HPC_CACHE=/tmp/grpo_cache
        ov+=(model.name_or_path=smollm2-135m rollout.engine=native rollout.prompts_per_step=16
            rollout.max_new_tokens=256 optim.lr=5e-6)
    else
        export GRPO_HPC_CACHE=/tmp/grpo_cache37
        ov+=(model.name_or_path=tiny rollout.prompts_per_step=8 rollout.max_new_tokens=64)
    fi
    # the profile asks 200 GB; a node with less (H200 machines start with little MemTotal)
    # gets a copy asking what the node has
    local profile=${GPU_PROFILE:-bench/slurm-h100x2.yaml} realmem
    realmem=$(scontrol show node localhost | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    if [[ -z ${GPU_PROFILE:-} ]] && ((realmem < 200 * 1024)); then
        cp bench/slurm-h100x2.yaml bench/slurm-gpu-setup.sh.j2 "$W/"
        sed -i "s/^mem_gb: 200/mem_gb: $((realmem * 9 / 10 / 1024))/" "$W/slurm-h100x2.yaml"
        profile=$W/slurm-h100x2.yaml
        echo "node RealMemory=$realmem MB < 200 GB: profile copy asks $((realmem * 9 / 10 / 1024)) GB"
    fi
    # GPU_OVERRIDES: more key=value words for grpo-submit (e.g. dist.strategy=fsdp)
    read -ra extra <<<"${GPU_OVERRIDES:-}"
    ov+=("${extra[@]}")
    local name=slurm-gsm8k-$model
    rm -rf "/tmp/runs37/$name"
    echo "== grpo-submit --profile $profile --config gsm8k --name $name ${ov[*]} ($(ts))"
    python3 -c "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))" \
        --profile "$profile" --config gsm8k --name "$name" "${ov[@]}" 2>&1 | tee "$OUT/submit.log"
    local run=/tmp/runs37/$name job
    job=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['job_id'])" "$run/jobs.jsonl") || return 1
    echo "job $job"
    # the host's core speed and load beside the job (a job slower, or its host?)
    python3 -m bench.probes.host_clock --out "$OUT/host_clock.jsonl" \
        --seconds "${SUBMIT_TIMEOUT:-300}" &
    local clock=$!
    status() { python3 -c "import sys; from grpo_hpc.cli.status import main; sys.exit(main(sys.argv[1:]))" "$@"; }
    local t0=$SECONDS last="" q envs=0 shown=0 step
    while ((SECONDS - t0 < ${SUBMIT_TIMEOUT:-300})); do
        q=$(squeue -h -j "$job" -o '%i %j %T %b %C %m %N %R' 2>/dev/null)
        if [[ $q != "$last" ]]; then
            echo "$(ts) $(squeue -h -j "$job" -o '%i %j %T %M %b %C %m %N %R' 2>&1)" | tee -a "$OUT/squeue.log"
            last=$q
        fi
        [[ -z $q ]] && break
        if ((!envs)); then
            # every rank's own environment: the trainer processes torchrun started (RANK set)
            for pid in $(pgrep -f 'grpo_hpc.train'); do
                e=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || continue
                grep -q '^RANK=' <<<"$e" || continue
                echo "pid $pid $(grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|CUDA_VISIBLE_DEVICES|SLURM_JOB_ID)=' <<<"$e" | sort | tr '\n' ' ')$(grep -E "$NVLS_RE" <<<"$e" | sort | tr '\n' ' ')"
            done >"$OUT/rank_env.txt"
            # done when every rank is seen (a rank's own children carry its RANK too)
            (($(grep -o ' RANK=[0-9]*' "$OUT/rank_env.txt" | sort -u | wc -l) >= ${GPU_RANKS:-2})) && envs=1
        fi
        step=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('step', 0))" "$run/progress.json" 2>/dev/null || echo 0)
        if ((!shown && step >= 2)); then
            { echo "\$ squeue"; squeue; echo "\$ grpo-status"; status; echo "\$ grpo-status $name"; status "$name"; } >"$OUT/status_running.txt" 2>&1
            shown=1
        fi
        sleep 2
    done
    kill "$clock" 2>/dev/null
    echo "== after the job ($(ts))"
    sleep 2
    { echo "\$ sacct -j $job"; sacct -j "$job" -o JobID,JobName%20,State,ExitCode,Elapsed,AllocTRES%60
        echo "\$ grpo-status"; status; echo "\$ grpo-status $name"; status "$name"; } 2>&1 | tee "$OUT/status_final.txt"
    find "$run" -name '*.sh' -path '*submitit*' -exec cp {} "$OUT/sbatch_script.sh" \;
    for f in "$run"/submitit/"$job"/*_log.out "$run"/submitit/"$job"/*_log.err; do
        [[ -f $f ]] && tail -c 60000 "$f" >"$OUT/job_${f##*/}"
    done
    grep -hE '\[job env\]|nranks|Init COMPLETE|NVLS|set by environment|cudaDev' \
        "$run"/submitit/"$job"/*_log.* 2>/dev/null | cut -c1-300 | head -n 60 >"$OUT/nccl_lines.txt"
    cp "$run/progress.json" "$run/metrics.jsonl" "$run/config.yaml" "$run/jobs.jsonl" "$OUT/" 2>/dev/null
    tail -c 30000 "$run/training_output.log" >"$OUT/training_output_tail.log" 2>/dev/null
    ls -R "$run" | head -n 80 >"$OUT/run_tree.txt"
    # training.profile_steps (GPU_OVERRIDES): each rank's operator table, and its trace;
    # training.stall_sample_ms: each rank's stalls-rank<R>.txt
    if [[ -d $run/torch_profile ]]; then
        mkdir -p "$OUT/torch_profile" && cp "$run"/torch_profile/*.txt "$OUT/torch_profile/"
        # a trace of two real steps is ~200 MB: gzipped, kept only while the tarball can
        # still come back from the device (the tables hold each rank's phases anyway)
        for t in "$run"/torch_profile/*.json; do
            [[ -f $t ]] || continue  # stall samples only: no trace
            gzip -c "$t" >"$OUT/torch_profile/${t##*/}.gz"
            if (($(stat -c %s "$OUT/torch_profile/${t##*/}.gz") > 12000000)); then
                rm "$OUT/torch_profile/${t##*/}.gz"
                echo "${t##*/}: $(du -h "$t" | cut -f1), too large to bring back" >>"$OUT/torch_profile/left_out.txt"
            fi
        done
    fi
    # how steady the steps were (size groups after warm-up, compilations)
    python3 -m bench.speed.step_spread "$run/metrics.jsonl" --steps --json "$OUT/step_spread.json" 2>&1 |
        tee "$OUT/step_spread.txt"
    cat "$OUT/nccl_lines.txt" | head -n 30
    cat "$OUT/rank_env.txt"
}

for s in $STAGES; do
    echo "######## $s ($(ts))"
    t0=$SECONDS
    "$s" || { echo "######## $s FAILED"; [[ $s == up ]] && exit 1; }
    echo "######## $s took $((SECONDS - t0)) s"
done
