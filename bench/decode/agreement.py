"""The native engine's agreement with HF ``generate`` and with a plain forward pass, for
bench/decode/run.py, and the weight re-draw its model-family runs use.

Agreement (``agreement``): greedy tokens of the native engine and of HF ``generate`` from
the same prompts (``--agree-new`` tokens, ``--agree-rows`` rows): per row the first
completion position where they differ (min / median over rows, the length where none
does) and the fraction of rows identical for the whole length; at each row's first
difference, HF's margin there: top-1 minus top-2 of a plain HF forward's logits over HF's
own prefix (in the compute dtype, upcast). Rule: a difference is a **near-tie** when that
margin is at most max(0.125, two bf16 steps at the top-1 logit's magnitude) -- two correct
bf16 implementations may then pick either token; a larger margin is a real disagreement.
A second judge needs no fixed threshold (``exact_check``): the same weights in fp32 give
the two tokens' exact logits there; the difference is **within bf16 error** when they are
at most max(0.125, twice HF's own bf16 forward's largest logit error at that position)
apart. ``hf_distinct_tokens_median`` says whether the tokens vary (1: degenerate text).
"""

from __future__ import annotations

import statistics

import torch

from grpo_hpc.train.algo.update import MicroBatch, completion_logp

NEAR_TIE = 0.125
"""A first difference is a near-tie when HF's top-1 minus top-2 logit there is at most
max(NEAR_TIE, two bf16 steps at the top-1 logit's magnitude)."""

FIXTURE_WIDTH = 64
"""hidden_size of tests/fixtures/families, where the CPU test's recipe was drawn."""


def vary_init(model: torch.nn.Module, eos: int, seed: int = 0, scaled: bool = False) -> None:
    """Re-draw a random model's weights as the CPU family test does (module docstring):
    tokens that vary, every norm mattering, no EOS (its head row zero). ``scaled``: each
    matrix's std times sqrt(64 / its input width), so that every unit's input is as large
    as in the 64-wide fixture at any width (the recipe as drawn makes a full-width model's
    activations ~width/64 times larger, and bf16's error with them)."""
    gemma = model.config.model_type.startswith("gemma")
    std = 0.02 if gemma else 0.3
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0 if gemma else 1.0, 2.0 if gemma else 0.3)
            elif p.dim() >= 2:
                p.normal_(0.0, std * (FIXTURE_WIDTH / p.shape[-1]) ** 0.5 if scaled else std)
        emb = model.get_input_embeddings()
        if emb.padding_idx is not None:
            emb.weight[emb.padding_idx] = 0.0
        model.get_output_embeddings().weight[eos] = 0.0


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at ``x``'s magnitude (8 significant bits)."""
    return 2.0 ** (torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)


def forward_logits(model, ids, mask, autocast, rows: int = 8):  # noqa: ANN001, ANN201
    """A plain forward's logits (fp32), ``rows`` rows at a time (a 262k vocabulary at
    full size would not fit at once), yielded per chunk with its first row."""
    for i in range(0, ids.shape[0], rows):
        with torch.no_grad(), autocast():
            out = model(input_ids=ids[i : i + rows], attention_mask=mask[i : i + rows])
        yield i, out.logits.float()


def first_differences(model, a, b, autocast) -> dict:  # noqa: ANN001
    """Per row, the first completion position where HF's greedy tokens (``a``) and the
    native engine's (``b``) differ (the compared length where none does); at each, HF's
    top-1 minus top-2 logit over HF's own prefix (``margin``), the native token's logit
    below HF's there (``gap``), and the near-tie rule of the module docstring."""
    ca, cb = a.input_ids[:, a.prompt_len :], b.input_ids[:, b.prompt_len :]
    n = min(ca.shape[1], cb.shape[1])
    diff = ca[:, :n] != cb[:, :n]
    first = torch.where(
        diff.any(1), diff.int().argmax(1), torch.full_like(diff[:, 0], n, dtype=torch.long)
    )
    diverged = []
    for i, logits in forward_logits(model, a.input_ids, a.attention_mask, autocast):
        for r in range(logits.shape[0]):
            row, t = i + r, int(first[i + r])
            if t == n:
                continue
            at = logits[r, a.prompt_len - 1 + t]
            top2 = at.topk(2).values
            margin = (top2[0] - top2[1]).item()
            tie = margin <= max(NEAR_TIE, 2 * bf16_step(top2[0]).item())
            gap = (at[ca[row, t]] - at[cb[row, t]]).item()
            diverged.append({"row": row, "pos": t, "margin": margin, "gap": gap, "near_tie": tie})
    exact_check(model, a, diverged, ca, cb, autocast)
    distinct = [len(set(r.tolist())) for r in ca[:, :n]]
    return {
        "compared_tokens": n,
        "rows": ca.shape[0],
        "identical_frac": (first == n).float().mean().item(),
        "first_diff_min": int(first.min()),
        "first_diff_median": statistics.median(first.tolist()),
        "near_tie_frac": (
            sum(d["near_tie"] for d in diverged) / len(diverged) if diverged else None
        ),
        "margin_max": max((d["margin"] for d in diverged), default=None),
        "within_bf16_error_frac": (
            sum(d.get("within_bf16_error", True) for d in diverged) / len(diverged)
            if diverged
            else None
        ),
        "diverged": diverged,
        "hf_distinct_tokens_median": statistics.median(distinct),
        "hf_distinct_tokens_min": min(distinct),
    }


def exact_check(model, a, diverged: list[dict], ca, cb, autocast) -> None:  # noqa: ANN001
    """A second judge of each first difference, free of the margin's fixed threshold: the
    same weights in fp32 (bf16 values upcast exactly; the model is put back after) give
    the two tokens' exact logits there (``gap_fp32``: HF's token minus native's) and how
    far HF's own low-precision forward errs at that position (``hf_lowp_error``: largest
    |logit| difference over the vocabulary). ``within_bf16_error``: |gap_fp32| is at most
    max(0.125, 2 x hf_lowp_error) -- the two tokens are closer than the precision can tell
    apart. Nothing to judge in fp32 runs (no difference from rounding)."""
    low = next(model.parameters()).dtype
    rows = sorted({d["row"] for d in diverged})
    with autocast():
        lowered = torch.is_autocast_enabled(a.input_ids.device.type)
    if not rows or (low == torch.float32 and not lowered):
        return
    by_row = {d["row"]: d for d in diverged}
    ids, mask = a.input_ids[rows], a.attention_mask[rows]
    at = [a.prompt_len - 1 + by_row[row]["pos"] for row in rows]
    lowp = [
        lg[r, at[i + r]]
        for i, lg in forward_logits(model, ids, mask, autocast)
        for r in range(lg.shape[0])
    ]
    model.float()
    try:
        off = lambda: torch.autocast(ids.device.type, enabled=False)  # noqa: E731
        for i, exact in forward_logits(model, ids, mask, off):
            for r in range(exact.shape[0]):
                d = by_row[rows[i + r]]
                x = exact[r, at[i + r]]
                gap = (x[ca[d["row"], d["pos"]]] - x[cb[d["row"], d["pos"]]]).item()
                err = (lowp[i + r] - x).abs().max().item()
                d |= {"gap_fp32": gap, "hf_lowp_error": err}
                d["within_bf16_error"] = abs(gap) <= max(NEAR_TIE, 2 * err)
    finally:
        model.to(low)


def agreement(model, tok, native, hf, prompts, autocast, device) -> dict:  # noqa: ANN001
    """Greedy: where native's tokens first differ from HF ``generate``'s and whether each
    first difference is a near-tie (``first_differences``), and whether every native
    greedy token is an argmax of a plain forward pass over its own prefix (``gap``:
    top-1 minus the chosen token's logit). Sampling: native log-probs vs the training
    forward's, on the native tokens."""
    a = hf.generate(prompts, 1, greedy=True)
    b = native.generate(prompts, 1, greedy=True)
    firsts = first_differences(model, a, b, autocast)
    gaps = []
    for i, logits in forward_logits(model, b.input_ids, b.attention_mask, autocast):
        pred = logits[:, b.prompt_len - 1 : -1]
        chosen = pred.gather(-1, b.input_ids[i : i + len(pred), b.prompt_len :, None])[..., 0]
        gaps.append((pred.max(-1).values - chosen)[b.completion_mask[i : i + len(pred)].bool()])
    gap = torch.cat(gaps)
    s = native.generate(prompts, max(1, 64 // len(prompts)))
    mb = MicroBatch(s, torch.arange(s.input_ids.shape[0]), torch.zeros(s.input_ids.shape[0]))
    with torch.no_grad(), autocast():
        lp, _ = completion_logp(model, mb)
    m = s.completion_mask.bool()
    diff = (lp - s.sampled_logp)[m].abs()
    return {
        "greedy_identical_to_hf": firsts["identical_frac"],
        "first_difference": firsts,
        "greedy_argmax_gap_max": gap.max().item(),
        "greedy_argmax_gap_mean": gap.mean().item(),
        "logp_absdiff_max": diff.max().item(),
        "logp_absdiff_mean": diff.mean().item(),
    }


def agreement_line(agree: dict) -> str:
    """One line of the agreement for the log."""
    f = agree["first_difference"]
    ties = "-" if f["near_tie_frac"] is None else f"{100 * f['near_tie_frac']:.0f}%"
    margin = "-" if f["margin_max"] is None else f"{f['margin_max']:.3f}"
    w = f["within_bf16_error_frac"]
    within = "-" if w is None else f"{100 * w:.0f}%"
    return (
        f"agreement: {f['rows']} rows x {f['compared_tokens']} greedy tokens: "
        f"{100 * f['identical_frac']:.0f}% identical to HF generate; first difference "
        f"min {f['first_diff_min']} median {f['first_diff_median']}; near-ties {ties} of "
        f"the differences (largest HF margin {margin}), within bf16 error {within}; HF "
        f"distinct tokens per row median "
        f"{f['hf_distinct_tokens_median']}; native logp vs forward max "
        f"{agree['logp_absdiff_max']:.3f}"
    )
