"""The systems the learning benchmark compares (``--systems``): each a runner (grpo_hpc or
TRL) and what it sets over the shared settings. Read by the runner (run.py) and by the
analysis (results.py: which problems a system's curve scores)."""

from __future__ import annotations

from grpo_hpc.config.schema import ASYNC_TIS_CAP

PLAIN = ["dist.compile=false", "algo.packing=false"]
"""The update as it was before 2026-11-25's defaults (auto: compiled layers and packed
micro-batches on the GPU): the runs stored under ``grpo_hpc_plain`` and every variant
below (each is plain with one change), so stored runs keep meaning what they measured."""

NUM_VAL = 128
"""Validation problems of the keep-best systems: drawn apart from the test problems (the
same ``--num-eval`` ones every system is scored on), so no figure is selected on."""
HANDED = [
    f"data.num_val={NUM_VAL}",
    "training.cut_off_patience=10",  # the defaults of the detector, not the plain run's 0
    "training.final=best",
]
"""The keep-best systems' settings over the shared ones: grpo_hpc's defaults for a run
that has a validation split (``training.on_collapse`` is set per system)."""

OPSM_DELTA = 0.02
"""``algo.offpolicy_mask`` of ``grpo_hpc_async_opsm``, chosen before any run, not tuned: an
order of magnitude above the bf16 engine/trainer gap of a synchronous step (k3 KL about
0.001 a token) and within what one update of staleness measured on this benchmark (0.005-
0.021 a token, learning_2term_mask_async48_h100_2026-12-05.json), so that it drops the
completions that drifted most, not every stale one."""

ZERO_STEP = "optim.skip_empty_steps=false"
"""AdamW's step on a zero gradient, as every asynchronous run took before 2026-12-06 made
``optim.skip_empty_steps`` default to on where ``algo.max_staleness`` >= 1: pinned in the
asynchronous systems measured before then, so their stored runs keep meaning what they
measured. ``grpo_hpc_async_skip_empty`` is the asynchronous default since."""

SYSTEMS = {
    # name: (runner, extra grpo_hpc overrides or TRL precision)
    "grpo_hpc": ("grpo_hpc", []),
    "grpo_hpc_timed": ("grpo_hpc", ["dist.deterministic_kernels=false"]),  # Inductor's timing
    "grpo_hpc_int8": ("grpo_hpc", ["optim.state=int8"]),  # the defaults, 8-bit AdamW moments
    "grpo_hpc_plain": ("grpo_hpc", PLAIN),
    "grpo_hpc_tempered": ("grpo_hpc", [*PLAIN, "algo.tempered_logp=true"]),
    "grpo_hpc_hf": ("grpo_hpc", [*PLAIN, "rollout.engine=hf"]),
    "grpo_hpc_tis": ("grpo_hpc", [*PLAIN, "algo.tis_cap=2"]),
    "grpo_hpc_fp32head": ("grpo_hpc", [*PLAIN, "algo.fp32_lm_head=true"]),
    "grpo_hpc_eager": ("grpo_hpc", [*PLAIN, "rollout.enforce_eager=true"]),
    # What a user gets: keep-best on a validation split, the collapse detector
    # acting, final/ (the best validation model) scored on the test problems afterwards
    "grpo_hpc_stop": ("grpo_hpc", HANDED + ["training.on_collapse=stop"]),
    "grpo_hpc_rollback": ("grpo_hpc", HANDED + ["training.on_collapse=rollback"]),
    # the detector only: which seeds it alarms on, and whether they would have recovered
    "grpo_hpc_flag": ("grpo_hpc", HANDED + ["training.on_collapse=flag"]),
    # asynchronous: each batch generated one update ahead (docs/async.md); AdamW's step on
    # a zero gradient pinned (ZERO_STEP): the asynchronous defaults until 2026-12-06
    "grpo_hpc_async": ("grpo_hpc", ["algo.max_staleness=1", ZERO_STEP]),
    # partial rollouts: two steps' prompts in flight, long answers continued (docs/async.md)
    "grpo_hpc_partial": (
        "grpo_hpc",
        ["algo.max_staleness=2", "rollout.partial_pool=2", ZERO_STEP],
    ),
    # two steps' batches from one rollout, the second one update stale (docs/async.md)
    "grpo_hpc_grouped": (
        "grpo_hpc",
        ["algo.max_staleness=1", "rollout.steps_per_generation=2", ZERO_STEP],
    ),
    # three steps' batches from one rollout (the 1.53x of one H100's long-tail benchmark)
    "grpo_hpc_grouped3": (
        "grpo_hpc",
        ["algo.max_staleness=2", "rollout.steps_per_generation=3", ZERO_STEP],
    ),
    # the two things an asynchronous run changes, apart: staleness without the truncated
    # importance weights it turns on (algo.tis_cap unset: 2.0 once max_staleness >= 1),
    # and those weights on a synchronous run (which has them off)
    "grpo_hpc_async_notis": ("grpo_hpc", ["algo.max_staleness=1", "algo.tis_cap=0", ZERO_STEP]),
    "grpo_hpc_sync_tis": ("grpo_hpc", [f"algo.tis_cap={ASYNC_TIS_CAP}"]),
    # the first 10 steps synchronous, then asynchronous (algo.synchronous_steps; N chosen
    # before any run: the asynchronous runs fell behind in the first 10-15 steps)
    "grpo_hpc_async_warm10": (
        "grpo_hpc",
        ["algo.max_staleness=1", "algo.synchronous_steps=10", ZERO_STEP],
    ),
    "grpo_hpc_grouped3_warm10": (
        "grpo_hpc",
        [
            "algo.max_staleness=2",
            "rollout.steps_per_generation=3",
            "algo.synchronous_steps=10",
            ZERO_STEP,
        ],
    ),
    # no AdamW step on a zero gradient (optim.skip_empty_steps): does the momentum's drift
    # on a run stalled at the cap deepen the trap? (written before any run, 2026-12-06; the
    # asynchronous one is the asynchronous defaults since that day's measurement)
    "grpo_hpc_skip_empty": ("grpo_hpc", ["optim.skip_empty_steps=true"]),
    "grpo_hpc_async_skip_empty": (
        "grpo_hpc",
        ["algo.max_staleness=1", "optim.skip_empty_steps=true"],
    ),
    # grouped generation M = 3 and partial rollouts at the asynchronous defaults since
    # 2026-12-06 (no AdamW step on a zero gradient: optim.skip_empty_steps unset, on where
    # algo.max_staleness >= 1; written before any run, 2026-12-06): do they learn as the
    # synchronous step does, as k = 1 does with it?
    "grpo_hpc_grouped3_skip_empty": (
        "grpo_hpc",
        ["algo.max_staleness=2", "rollout.steps_per_generation=3"],
    ),
    "grpo_hpc_partial_skip_empty": (
        "grpo_hpc",
        ["algo.max_staleness=2", "rollout.partial_pool=2"],
    ),
    # asynchronous with off-policy sequence masking: a stale completion with a negative
    # advantage trains nothing once it drifted OPSM_DELTA nats a token (docs/async.md)
    "grpo_hpc_async_opsm": (
        "grpo_hpc",
        ["algo.max_staleness=1", f"algo.offpolicy_mask={OPSM_DELTA}", ZERO_STEP],
    ),
    # what a user with a validation split gets, asynchronous: keep-best, the rescue acting
    # (a rollback also makes the run synchronous: training.rollback_synchronous, default)
    "grpo_hpc_rollback_async": (
        "grpo_hpc",
        [*HANDED, "training.on_collapse=rollback", "algo.max_staleness=1", ZERO_STEP],
    ),
    # the same, three steps' batches from one rollout (rollout.steps_per_generation=3)
    "grpo_hpc_rollback_grouped3": (
        "grpo_hpc",
        [
            *HANDED,
            "training.on_collapse=rollback",
            "algo.max_staleness=2",
            "rollout.steps_per_generation=3",
            ZERO_STEP,
        ],
    ),
    "trl": ("trl", "bf16"),
    "trl_fp32": ("trl", "fp32"),
}

PAIRS = [
    ("grpo_hpc", "grpo_hpc_async"),
    ("grpo_hpc", "grpo_hpc_partial"),
    ("grpo_hpc", "grpo_hpc_grouped"),
    ("grpo_hpc", "grpo_hpc_grouped3"),
    ("grpo_hpc", "grpo_hpc_async_opsm"),
    ("grpo_hpc", "grpo_hpc_async_notis"),
    ("grpo_hpc", "grpo_hpc_sync_tis"),
    ("grpo_hpc", "grpo_hpc_async_warm10"),
    ("grpo_hpc", "grpo_hpc_skip_empty"),
    ("grpo_hpc_async", "grpo_hpc_async_skip_empty"),
    ("grpo_hpc", "grpo_hpc_grouped3_warm10"),
    ("grpo_hpc", "grpo_hpc_grouped3_skip_empty"),
    ("grpo_hpc_grouped3", "grpo_hpc_grouped3_skip_empty"),
    ("grpo_hpc", "grpo_hpc_partial_skip_empty"),
    ("grpo_hpc_rollback", "grpo_hpc_rollback_async"),
    ("grpo_hpc_rollback", "grpo_hpc_rollback_grouped3"),
]
"""(baseline, variant) compared seed by seed when a file holds both (results.paired)."""
