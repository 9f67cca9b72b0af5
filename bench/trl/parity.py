"""One GRPO update on one fixed batch, through grpo_hpc and through TRL 1.16's GRPOTrainer.

The batch (prompt ids, completion ids, rewards) is made here, not sampled, so both sides
train on exactly the same tokens: TRL receives it through its ``rollout_func`` hook and
a reward function that looks the rewards up, then runs its own advantages, loss,
micro-batching, gradient accumulation, grad-norm clip and AdamW step
(``trainer.train()`` for one step). grpo_hpc runs its own pieces: ``select_groups``
(advantages, the overlong mask, micro-batches), ``update.accumulate`` and
``StepOptimizer.optimizer_step``.

Matched settings: ``loss_type="dapo"`` (token-level sum over the whole batch divided by
its completion tokens), ``scale_rewards="group"`` (unbiased group std, eps 1e-4),
clip 0.2 / 0.28, beta 0, one update per batch (ratio exactly 1), AdamW betas 0.9/0.99,
no weight decay, constant rate, grad-norm clip 1.0, the same rows per micro-batch.

What each side returns (:class:`Side`): the loss, the gradient after the clip (TRL's, as
its optimizer sees it; grpo_hpc's clipped with the same rule), the gradient norm before
the clip, and the parameters after the step. :func:`compare` reduces two sides to
relative errors and cosines. The CPU test (tests/e2e/test_trl_parity.py) holds them in
fp32; on a GPU ``python -m bench.trl.parity --out DIR`` compares both sides' bf16 paths
against the fp32 reference of the same batch.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_hpc.config.schema import Config
from grpo_hpc.train.algo import update
from grpo_hpc.train.algo.batching import Scored, select_groups
from grpo_hpc.train.algo.logp_head import Scoring
from grpo_hpc.train.algo.optimization import StepOptimizer
from grpo_hpc.train.distributed import dist
from grpo_hpc.train.rollout.types import RolloutBatch


@dataclass(frozen=True)
class Settings:
    """The shared knobs of one parity comparison."""

    micro: int = 8
    """Completions per micro-batch (TRL: per_device_train_batch_size)."""
    lr: float = 1e-4
    """AdamW learning rate; large enough that one step moves every parameter visibly."""
    grad_clip: float = 1.0
    """Grad-norm clip (TRL: max_grad_norm)."""
    temperature: float = 1.0
    """TRL divides the logits by this before the log-softmax of the update; grpo_hpc does
    with ``algo.tempered_logp`` (set here when it is not 1)."""
    precision: str = "fp32"
    """fp32, or bf16 (autocast over fp32 weights on both sides)."""
    mask_truncated: bool = False
    """DAPO's overlong filtering on both sides (grpo_hpc: ``algo.mask_truncated``; TRL:
    ``mask_truncated_completions``)."""


@dataclass
class ParityBatch:
    """One step's rollouts: ``groups`` prompts, ``G`` completions each, and rewards."""

    prompts: list[list[int]]
    completions: list[list[int]]
    """groups x G, group after group; a terminated one ends with EOS."""
    rewards: list[float]
    G: int


def make_batch(
    vocab: int, eos: int, pad: int, groups: int = 4, G: int = 8, max_new: int = 24, seed: int = 0
) -> ParityBatch:
    """Random prompts of different lengths, completions of very different lengths (a third
    cut at ``max_new`` without EOS), rewards with ties and one all-equal group (zero
    advantage): the cases where normalisers and masks can go wrong."""
    rng = random.Random(seed)
    ids = [i for i in range(vocab) if i not in (eos, pad)]
    prompts = [[rng.choice(ids) for _ in range(rng.randint(3, 12))] for _ in range(groups)]
    completions, rewards = [], []
    for g in range(groups):
        for _ in range(G):
            if rng.random() < 0.33:
                completions.append([rng.choice(ids) for _ in range(max_new)])  # cut off
            else:
                n = rng.randint(1, max_new - 1)
                completions.append([rng.choice(ids) for _ in range(n - 1)] + [eos])
            flat = g == groups - 1
            rewards.append(0.5 if flat else rng.choice([0.0, 1.0, 1.2, -0.5]))
        if len({tuple(c) for c in completions[-G:]}) < G:  # the reward lookup needs distinct rows
            return make_batch(vocab, eos, pad, groups, G, max_new, seed + 1000)
    return ParityBatch(prompts, completions, rewards, G)


@dataclass
class Side:
    """What one system did with the batch."""

    loss: float
    grad_norm: float
    """Before the clip."""
    grads: dict[str, torch.Tensor]
    """After the clip, as the optimizer used them (fp32, CPU)."""
    params: dict[str, torch.Tensor]
    """After the optimizer step (fp32, CPU)."""
    extra: dict[str, float] = field(default_factory=dict)


def _snapshot(model: torch.nn.Module, what: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        t = p.grad if what == "grad" else p
        if p.requires_grad and t is not None:
            out[name] = t.detach().float().cpu().clone()
    return out


def rollout_batch(pb: ParityBatch, pad: int, device: torch.device) -> RolloutBatch:
    """The batch as grpo_hpc's engines return it: left-padded prompts, right-padded
    completions, the attention mask up to and including EOS."""
    p = max(len(x) for x in pb.prompts)
    c = max(len(x) for x in pb.completions)
    ids, attn, cmask = [], [], []
    for i, comp in enumerate(pb.completions):
        prompt = pb.prompts[i // pb.G]
        lpad, rpad = p - len(prompt), c - len(comp)
        ids.append([pad] * lpad + prompt + comp + [pad] * rpad)
        attn.append([0] * lpad + [1] * (len(prompt) + len(comp)) + [0] * rpad)
        cmask.append([1] * len(comp) + [0] * rpad)

    def t(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    batch = RolloutBatch(t(ids), t(attn), t(cmask), p, [""] * len(ids), pad_token_id=pad)
    batch.finished = torch.tensor([len(c) < c_max(pb) for c in pb.completions], device=device)
    return batch


def c_max(pb: ParityBatch) -> int:
    """The length cap of the batch: its longest completion (cut-off rows reach it)."""
    return max(len(c) for c in pb.completions)


def run_grpo_hpc(model: torch.nn.Module, pb: ParityBatch, s: Settings, pad: int) -> Side:
    """grpo_hpc's update on ``pb``: its group selection (advantages, masking, split),
    accumulate and optimizer step."""
    device = next(model.parameters()).device
    cfg = Config()
    cfg.algo.micro_batch_size = s.micro
    cfg.algo.micro_batch_tokens = 0
    cfg.algo.tempered_logp = s.temperature != 1.0
    cfg.algo.mask_truncated = s.mask_truncated
    cfg.rollout.temperature = s.temperature
    cfg.optim.lr, cfg.optim.grad_clip = s.lr, s.grad_clip
    cfg.dist.precision = s.precision
    info = dist.DistInfo(device=device)
    bf16 = s.precision == "bf16"

    def autocast():  # noqa: ANN202
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    opt = StepOptimizer(model, cfg, info, autocast)
    batch = rollout_batch(pb, pad, device)
    scored = Scored(batch, torch.tensor(pb.rewards).view(-1, pb.G), {})
    mbs = select_groups([scored], len(pb.prompts), pb.G, cfg.algo).microbatches
    model.train()
    stats = update.accumulate(
        model,
        mbs,
        cfg.algo,
        info,
        cfg.rollout.max_new_tokens,
        None,
        autocast,
        Scoring(s.temperature),
    )
    pre = _snapshot(model, "grad")
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in pre.values())).item()
    norm_used = opt.optimizer_step(0, lambda: None)  # clips (in place) and steps
    coef = min(1.0, s.grad_clip / (norm_used + 1e-6))  # torch's clip rule
    clipped = {k: v * coef for k, v in pre.items()}
    return Side(stats["loss"], norm, clipped, _snapshot(model, "param"), {"norm_used": norm_used})


def run_trl(model: torch.nn.Module, tok: object, pb: ParityBatch, s: Settings, work: Path) -> Side:
    """TRL's GRPOTrainer for one step on ``pb`` (its rollout_func hands back the batch)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    names = [f"prompt {i}" for i in range(len(pb.prompts))]
    served: dict[str, int] = {}

    def rollout(prompts: list[str], trainer: object) -> dict:
        prompt_ids, completion_ids = [], []
        for text in prompts:
            g = names.index(text)
            k = served.get(text, 0)
            served[text] = k + 1
            prompt_ids.append(pb.prompts[g])
            completion_ids.append(pb.completions[g * pb.G + k % pb.G])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    table = {
        (names[i // pb.G], tuple(c)): r
        for i, (c, r) in enumerate(zip(pb.completions, pb.rewards, strict=True))
    }

    def reward(prompts: list, completion_ids: list, **kw: object) -> list[float]:
        return [table[(p, tuple(c))] for p, c in zip(prompts, completion_ids, strict=True)]

    class Grab(TrainerCallback):
        grads: dict[str, torch.Tensor] = {}

        def on_pre_optimizer_step(self, args, state, control, **kw):  # noqa: ANN001, ANN201
            Grab.grads = _snapshot(trainer.model, "grad")

    n = len(pb.completions)
    cuda = next(model.parameters()).device.type == "cuda"
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=s.micro,
        gradient_accumulation_steps=n // s.micro,
        num_generations=pb.G,
        max_completion_length=c_max(pb),
        mask_truncated_completions=s.mask_truncated,
        temperature=s.temperature,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=s.grad_clip,
        optim="adamw_torch",
        bf16=s.precision == "bf16",
        use_cpu=not cuda,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        max_steps=1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": names}),
        rollout_func=rollout,
        callbacks=[Grab()],
    )
    trainer.train()
    log = next(h for h in trainer.state.log_history if "grad_norm" in h)
    return Side(
        float(log["loss"]), float(log["grad_norm"]), Grab.grads, _snapshot(trainer.model, "param")
    )


def _sq(x: torch.Tensor) -> torch.Tensor:
    """``sum(x ** 2)`` accumulated in fp64, without an fp64 copy of ``x``."""
    return torch.linalg.vector_norm(x, dtype=torch.float64) ** 2


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum(a * b)`` accumulated in fp64."""
    return torch.sum(a * b, dtype=torch.float64)


def rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``|a - b| / |b|`` over all tensors together (L2). The difference of two fp32 tensors
    that nearly agree is exact in fp32 (Sterbenz), so only the sums need fp64: no fp64
    copy of every parameter (SmolLM2's 135M: seconds per call on a loaded CPU)."""
    num = sum(_sq(a[k] - b[k]) for k in b)
    den = sum(_sq(b[k]) for k in b)
    return float(torch.sqrt(num / den))


def cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    dot = sum(_dot(a[k], b[k]) for k in b)
    na = torch.sqrt(sum(_sq(a[k]) for k in b))
    nb = torch.sqrt(sum(_sq(b[k]) for k in b))
    return float(dot / (na * nb))


def compare(a: Side, b: Side, start: dict[str, torch.Tensor]) -> dict[str, float]:
    """How far side ``a`` is from side ``b`` (the reference): gradient, step, loss."""
    step_a = {k: a.params[k] - start[k] for k in start}
    step_b = {k: b.params[k] - start[k] for k in start}
    return {
        "loss_a": a.loss,
        "loss_b": b.loss,
        "grad_norm_a": a.grad_norm,
        "grad_norm_b": b.grad_norm,
        "grad_rel_err": rel_err(a.grads, b.grads),
        "grad_cosine": cosine(a.grads, b.grads),
        "step_rel_err": rel_err(step_a, step_b),
        "step_cosine": cosine(step_a, step_b),
    }


def both(
    model: torch.nn.Module, tok: object, pb: ParityBatch, s: Settings, pad: int
) -> tuple[Side, Side, dict[str, torch.Tensor]]:
    """Each system on its own copy of ``model``; the starting parameters."""
    start = _snapshot(model, "param")
    ours = run_grpo_hpc(copy.deepcopy(model), pb, s, pad)
    with tempfile.TemporaryDirectory() as d:
        theirs = run_trl(copy.deepcopy(model), tok, pb, s, Path(d))
    return ours, theirs, start


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="directory for trl_parity.json")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m or a HF directory")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.9)
    args = p.parse_args()
    from bench.common import env_info, write_result
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.train.setup import models

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = models.materialize(ModelConfig(name_or_path=args.model), Path("."), 0)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", device)
    pad = tok.pad_token_id
    pb = make_batch(len(tok), tok.eos_token_id, pad, args.groups, args.G, args.max_new)
    result: dict = {"benchmark": "trl_parity", "config": vars(args) | {"out": str(args.out)}}
    sides = {}
    for precision in ("fp32", "bf16") if device.type == "cuda" else ("fp32",):
        s = Settings(temperature=args.temperature, precision=precision)
        ours, theirs, start = both(model, tok, pb, s, pad)
        sides[precision] = (ours, theirs)
        result[f"grpo_hpc_vs_trl_{precision}"] = compare(ours, theirs, start)
        print(precision, json.dumps(result[f"grpo_hpc_vs_trl_{precision}"], indent=1), flush=True)
    if "bf16" in sides:  # each side's bf16 path against the fp32 reference (TRL's)
        ref = sides["fp32"][1]
        for who, i in (("grpo_hpc", 0), ("trl", 1)):
            result[f"{who}_bf16_vs_fp32"] = compare(sides["bf16"][i], ref, start)
            print(who, "bf16 vs fp32", json.dumps(result[f"{who}_bf16_vs_fp32"], indent=1))
    result["env"] = env_info()
    write_result(result, args.out / "trl_parity.json")


if __name__ == "__main__":
    main()
