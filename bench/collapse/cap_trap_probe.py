"""The CPU probe of bench/collapse/cap_trap.py (``--probe N``): the real SmolLM2-135M-Instruct at
step 0 on the learning benchmark's prompts, HF generate at T=0.9, N prompts x G=8 sampled
to 96 tokens and also read at 48: who gets gradient under the overlong mask and with what
sign, the push on ending, and the same at a 96-token cap. Imported only when probing (it
loads torch and transformers)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from bench.collapse.cap_samples import CAP, describe, mean, sample_kind


def group_stats(rewards: list[float], finished: list[bool], eps: float = 1e-4) -> dict:
    """GRPO advantages of one group (unbiased std, all G rewards, cut ones included, as
    ``group_advantages`` does) and what the overlong mask leaves to train (pure)."""
    g = len(rewards)
    mu = sum(rewards) / g
    sd = math.sqrt(sum((x - mu) ** 2 for x in rewards) / (g - 1))
    flat = max(rewards) - min(rewards) <= 1e-8
    adv = [0.0 if flat else (x - mu) / (sd + eps) for x in rewards]
    trained = [a for a, f in zip(adv, finished, strict=True) if f]
    return {
        "trains": any(a != 0 for a in trained),
        "finished": len(trained),
        "push_to_end": sum(trained),
        "negative_trained": sum(a < 0 for a in trained),
        "abs_trained": sum(abs(a) for a in trained),
        "positive_trained": sum(a > 0 for a in trained),
    }


def score(texts: list[str], golds: list[str]) -> list[list[float]]:
    """(total, correctness, format) per completion with the benchmark's mask reward."""
    from grpo_hpc.train.rewards.functions import compute_rewards

    weights = {"correctness": 1.0, "format": 0.2, "overlong": 0.0}
    out = compute_rewards(texts, [{"gold": g} for g in golds], weights, require_marker=False)
    return [
        list(x)
        for x in zip(
            out.total, out.components["correctness"], out.components["format"], strict=True
        )
    ]


def probe(prompts: int, g: int = 8, long_cap: int = 96, seed: int = 0) -> dict:
    """Step-0 rollouts of the real model, read at 48 and at ``long_cap`` tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.sums_task import SYSTEM, data_config
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.tasks import problems as data
    from grpo_hpc.train.setup import models

    torch.manual_seed(seed)
    model_dir = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("."), 0)
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = data_config(argparse.Namespace(num_eval=256, terms=2))
    eos = tok.eos_token_id
    completions: list[dict] = []
    t0 = time.time()
    for s in range(seed, seed + prompts // 4):  # the first 4 prompts (step 1) of each seed
        train, _ = data.load_problems(cfg, s)
        chunk = [train[i] for i in data.Sampler(len(train), s).take(4)]
        texts = [data.prompt_text(tok, p["question"], SYSTEM) for p in chunk for _ in range(g)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc, do_sample=True, temperature=0.9, top_k=0, top_p=1.0,
                max_new_tokens=long_cap, pad_token_id=eos, eos_token_id=eos,
            )  # fmt: skip
        for j, ids in enumerate(out[:, enc["input_ids"].shape[1] :].tolist()):
            n = ids.index(eos) + 1 if eos in ids else len(ids)
            completions.append({"gold": chunk[j // g]["gold"], "ids": ids[:n]})
        print(f"probe: seed {s} done, {time.time() - t0:.0f} s", flush=True)
    rows = []
    for k, c in enumerate(completions):
        row = {"group": k // g, "gold": c["gold"], "tokens": len(c["ids"])}
        row["eos"] = c["ids"][-1] == eos
        for cap in (CAP, long_cap):
            text = tok.decode(c["ids"][:cap], skip_special_tokens=True)
            row[f"reward{cap}"] = score([text], [c["gold"]])[0]
            if cap == CAP:
                row["text48"] = text
        rows.append(row)
    return {"prompts": prompts, "G": g, "caps": [CAP, long_cap]} | {
        "generate_s": round(time.time() - t0, 1),
        "rows": rows,
    }


def finished_at(row: dict, cap: int) -> bool:
    return row["eos"] and row["tokens"] <= cap


def probe_summaries(pr: dict) -> dict:
    """What the stored probe rows say at each cap (pure)."""
    rows, g = pr["rows"], pr["G"]
    out: dict = {}
    for cap in pr["caps"]:
        sc = [r[f"reward{cap}"] for r in rows]
        fin = [finished_at(r, cap) for r in rows]
        out[str(cap)] = probe_summary(sc, fin, [r["tokens"] for r in rows], g)
    cut48 = [r for r in rows if not finished_at(r, CAP)]
    out["cut_at_48"] = len(cut48)
    out["cut_at_48_finished_by_96"] = sum(finished_at(r, 96) for r in cut48)
    out["cut_at_48_samples"] = {
        f: round(mean([k[f] for k in kinds]), 3)
        for kinds in [[probe_kind(r) for r in cut48]]
        for f in ("gold_written", "answer_line", "repeated_line", "repeated_6gram")
    }
    return out


def probe_kind(row: dict) -> dict:
    sample = {"completion": row["text48"], "question": "", "tokens": CAP, "reward": 0}
    return sample_kind(sample, int(row["gold"]))


def probe_summary(sc: list[list[float]], fin: list[bool], lengths: list[int], g: int) -> dict:
    """Rewards and advantage mechanics of the probe's completions at one cap (pure)."""
    groups = [
        group_stats([s[0] for s in sc[i : i + g]], fin[i : i + g]) for i in range(0, len(sc), g)
    ]
    cut = [s for s, f in zip(sc, fin, strict=True) if not f]
    done = [s for s, f in zip(sc, fin, strict=True) if f]
    push = [x["push_to_end"] for x in groups if x["trains"]]
    steps = [sum(x["push_to_end"] for x in groups[i : i + 4]) for i in range(0, len(groups), 4)]

    def abs_adv(gs: list[dict]) -> float | None:
        n = sum(x["positive_trained"] + x["negative_trained"] for x in gs)
        return round(sum(x["abs_trained"] for x in gs) / n, 3) if n else None

    return {
        "completions": len(sc),
        "cut_share": round(len(cut) / len(sc), 3),
        "finished_length": describe([n for n, f in zip(lengths, fin, strict=True) if f])
        if done
        else None,
        "cut": {
            "n": len(cut),
            "correct": round(mean([s[1] for s in cut]), 3),
            "format": round(mean([s[2] for s in cut]), 3),
        },
        "finished": {
            "n": len(done),
            "correct": round(mean([s[1] for s in done]), 3),
            "format": round(mean([s[2] for s in done]), 3),
        },
        "groups": len(groups),
        "groups_that_train": sum(x["trains"] for x in groups),
        "trained_rows_positive": sum(x["positive_trained"] for x in groups),
        "trained_rows_negative": sum(x["negative_trained"] for x in groups),
        "groups_pushing_to_end": sum(p > 0 for p in push),
        "groups_pushing_to_run_on": sum(p < 0 for p in push),
        "mean_abs_advantage_of_trained_rows": {
            "groups_pushing_to_end": abs_adv([x for x in groups if x["push_to_end"] > 0]),
            "groups_pushing_to_run_on": abs_adv([x for x in groups if x["push_to_end"] < 0]),
        },
        "mean_push_to_end_of_training_groups": round(mean(push), 3) if push else None,
        "step_push_to_end": [round(x, 2) for x in steps],
        "steps_pushing_to_run_on": sum(x < 0 for x in steps),
        "steps_training_nothing": sum(x == 0 for x in steps),
        "p_step_of_4_groups_trains_nothing": round(
            (1 - sum(x["trains"] for x in groups) / len(groups)) ** 4, 3
        ),
    }
