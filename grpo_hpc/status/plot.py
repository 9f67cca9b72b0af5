"""``grpo-status RUN --plot FILE.png``: a run's training curves from metrics.jsonl and
jobs.jsonl as one PNG (matplotlib, headless Agg backend)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.events import Phase

PANELS = (
    ("reward/mean", "reward (mean ± std)"),
    ("reward/correctness", "correctness"),
    ("kl", "KL to reference"),
    ("gen_len/mean", "generation length (tokens)"),
    ("eval/accuracy", "held-out accuracy (greedy)"),
    ("reward/format", "answer-line format"),
    ("entropy", "policy entropy (nats/token)"),
    ("rollout/engine_kl", "engine vs trainer KL (k3/token)"),
    ("clip_frac", "clipped share of tokens"),
)
"""(metrics key, panel title), in the order they are drawn."""
STALENESS_MEAN = "staleness/mean"
"""Not logged: the mean of the step's staleness histogram (``staleness/0 .. k``), computed."""
ASYNC_PANELS = (
    (STALENESS_MEAN, "samples' staleness (updates; max dashed)"),
    ("rollout/is_weight_mean", "importance weight (mean; largest dashed)"),
    ("rollout/is_clipped_frac", "share the weight cap cut (masked completions dashed)"),
)
"""Drawn after ``PANELS`` for an asynchronous run (``algo.max_staleness`` >= 1: its metrics
carry ``staleness/max``): how stale the trained samples were, and the off-policy
correction's weights. A synchronous run's panels stay as they were."""
OVERLAYS = {
    "eval/accuracy": "eval/accuracy_strict",
    STALENESS_MEAN: "staleness/max",
    "rollout/is_weight_mean": "rollout/is_weight_max",
    # algo.offpolicy_mask: the share of completions it dropped (a run with it off logs none)
    "rollout/is_clipped_frac": "rollout/offpolicy_masked_frac",
}
"""A second series drawn dashed in another key's panel (held-out: with an answer line)."""
BOUNDED = (
    "reward/correctness", "eval/accuracy", "reward/format", "clip_frac", "rollout/is_clipped_frac",
)  # fmt: skip
"""Panels drawn on a fixed 0..1 scale, so that runs compare at a glance."""
PASS_AT = "eval/pass@"
"""Prefix of the held-out pass@k of code tasks (eval/pass@1, eval/pass@10, ...)."""
CODE_HELD_OUT_TITLE = "held-out pass@1 (code, sandboxed)"
"""Title of the held-out panel in a run that logs pass@k instead of eval/accuracy."""
CODE_REWARD = ("reward/code", "code reward (every test passes)")
"""Drawn in the correctness panel of a run that logs the code reward and no correctness."""
KL = "kl"
"""The KL-to-reference panel's key: drawn only for a run that has a reference policy."""
NO_REFERENCE = "no KL panel: algo.beta = 0,\nthe run has no reference policy"
"""Written where the KL panel would be in a run without a reference."""


@dataclass
class PlotData:
    """What the picture shows: per-metric (step, value) series and where attempts began."""

    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """Metrics key -> (step, value) in logging order; non-numbers dropped."""
    reward_std: list[tuple[int, float]] = field(default_factory=list)
    """(step, reward/std) for the spread band (runs logged before it existed have none)."""
    attempts: list[tuple[int, float]] = field(default_factory=list)
    """(attempt number, step position) of every attempt after the first."""
    collapses: list[tuple[int, str]] = field(default_factory=list)
    """(step, "signal: action") of every collapse event (events.jsonl, phase collapse)."""
    reference: bool = True
    """Whether the run trains against a reference policy (``algo.beta`` > 0): without one
    its logged KL is 0 by construction, and the KL panel is left out."""
    asynchronous: bool = False
    """Whether the metrics carry a staleness histogram (an ``algo.max_staleness`` run):
    then the ``ASYNC_PANELS`` are drawn too."""

    def panels(self) -> list[tuple[str, str]]:
        """(metrics key, title) of the panels drawn, in order (pure)."""
        extra = list(ASYNC_PANELS) if self.asynchronous else []
        return [(k, t) for k, t in PANELS if k != KL or self.reference] + extra


def has_reference(beta: float | None) -> bool:
    """Whether a run has a reference policy to show a KL to (pure). ``beta``: the run's
    ``algo.beta`` from its config.yaml, the trainer's own switch (it loads a reference only
    when beta > 0, and the config is fixed for the run's life: --resume refuses overrides).
    The metrics cannot tell: with beta 0 the trainer logs kl 0.0, and so does a run with a
    reference at its first steps, while the policy still is the reference. None (no
    readable config.yaml): drawn, as it always was; nothing logged is hidden."""
    return beta is None or beta > 0


def plot_data(
    metrics: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    beta: float | None = None,
    events: list[dict[str, Any]] | None = None,
) -> PlotData:
    """The series of every panel (pure); ``beta`` is the run's ``algo.beta`` (None: unknown,
    see :func:`has_reference`). An attempt's line sits just before the first step logged
    after its submission (or after the last step when it has logged none yet); a collapse
    (``events``: the run's events.jsonl) is a red line at the step it was detected."""
    data = PlotData()
    pass_keys = sorted({k for m in metrics for k in m if k.startswith(PASS_AT)})
    keys = [k for k, _ in PANELS + ASYNC_PANELS] + list(OVERLAYS.values()) + pass_keys
    for key in [*keys, CODE_REWARD[0]]:
        data.series[key] = _series(metrics, key)
    data.series[STALENESS_MEAN] = staleness_mean(metrics)
    data.asynchronous = bool(data.series["staleness/max"])
    data.reward_std = _series(metrics, "reward/std")
    timed = [(float(m["time"]), int(m["step"])) for m in metrics if _point(m.get("time"), m)]
    last = max((s for _, s in timed), default=0)
    for job in jobs[1:]:
        submitted = job.get("submitted_at")
        if not isinstance(submitted, (int, float)):
            continue
        after = [s for t, s in timed if t >= submitted]
        data.attempts.append((int(job.get("attempt", 0)), (after[0] if after else last + 1) - 0.5))
    data.reference = has_reference(beta)
    data.collapses = collapse_marks(events or [])
    return data


def staleness_mean(metrics: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, mean staleness of the samples trained) from each row's histogram
    ``staleness/0 .. staleness/k`` (pure; rows without one are skipped)."""
    out = []
    for m in metrics:
        buckets = {
            int(k.rsplit("/", 1)[1]): float(v)
            for k, v in m.items()
            if k.startswith("staleness/") and k.rsplit("/", 1)[1].isdigit() and _point(v, m)
        }
        if sum(buckets.values()) > 0:
            total = sum(buckets.values())
            out.append((int(m["step"]), sum(s * n for s, n in buckets.items()) / total))
    return out


def collapse_marks(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(step, "signal: action") of the trainer's collapse events (pure)."""
    return [
        (int(e["step"]), f"{e.get('signal', '?')}: {str(e.get('action', '')).lower()}")
        for e in events
        if e.get("phase") == Phase.COLLAPSE and isinstance(e.get("step"), int)
    ]


def panel(data: PlotData, key: str, title: str) -> tuple[str, str, str]:
    """(series, title, dashed overlay) drawn in the panel of ``key`` (pure): a code run's
    held-out panel shows pass@1, with its largest pass@k dashed, and its correctness panel
    the code reward."""
    if key == "reward/correctness" and not data.series.get(key) and data.series.get(CODE_REWARD[0]):
        return CODE_REWARD[0], CODE_REWARD[1], ""
    if key == "eval/accuracy" and not data.series.get(key) and data.series.get(PASS_AT + "1"):
        ks = sorted(int(k[len(PASS_AT) :]) for k in data.series if k.startswith(PASS_AT))
        return PASS_AT + "1", CODE_HELD_OUT_TITLE, PASS_AT + str(ks[-1]) if ks[-1] > 1 else ""
    return key, title, OVERLAYS.get(key, "")


def _point(value: Any, m: dict[str, Any]) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok and isinstance(m.get("step"), int)


def _series(metrics: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(m["step"]), float(m[key])) for m in metrics if _point(m.get(key), m)]


def build_figure(data: PlotData, title: str) -> Any:
    """The matplotlib Figure: one panel per entry of ``data.panels()``, step on every x
    axis; a run without a reference gets, in the grid's spare cell, a note saying why its
    KL panel is missing."""
    plt = _pyplot()
    shown = data.panels()
    rows = -(-len(shown) // 3) if len(shown) > 9 else 3  # a 4th row for the async panels
    fig, grid = plt.subplots(rows, 3, figsize=(15, 3 * rows))
    for ax in grid.flat[len(shown) :]:  # the cell the KL panel left
        ax.axis("off")
        if not data.reference:
            ax.text(0.5, 0.5, NO_REFERENCE, ha="center", va="center", color="grey", fontsize=9)
    for ax, (key, panel_title) in zip(grid.flat, shown, strict=False):
        shown, label, overlay = panel(data, key, panel_title)
        points = data.series.get(shown, [])
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(points) < 30 else None, ms=3, label=shown)
            extra = data.series.get(overlay, [])
            if extra:
                xs, ys = zip(*extra, strict=True)
                ax.plot(xs, ys, ls="--", marker="x", ms=3, label=overlay)
                ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        if key == "reward/mean" and data.reward_std:
            mean = dict(points)
            band = [(s, mean[s], sd) for s, sd in data.reward_std if s in mean]
            if band:
                xs, ms, sds = zip(*band, strict=True)
                lo = [m - sd for m, sd in zip(ms, sds, strict=True)]
                hi = [m + sd for m, sd in zip(ms, sds, strict=True)]
                ax.fill_between(xs, lo, hi, alpha=0.25, label="± std")
        first = key == "reward/mean"
        for attempt, x in data.attempts:
            _marker(ax, x, f"attempt {attempt}" if first else None, "grey", "--", top=True)
        for step, what in data.collapses:
            _marker(ax, step, f"collapse ({what})" if first else None, "red", "-", top=False)
        if key in BOUNDED:
            ax.set_ylim(-0.03, 1.03)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.set_xlim(*_step_range(data))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _marker(ax: Any, x: float, label: str | None, color: str, ls: str, *, top: bool) -> None:
    """A vertical line at step ``x`` (where an attempt began: grey, dashed; a detected
    collapse: red), its label written along it (in the first panel only)."""
    ax.axvline(x, color=color, ls=ls, lw=0.8 if ls == "--" else 1.0, alpha=1.0 if top else 0.7)
    if label:
        ax.annotate(
            label,
            (x, 1 if top else 0.02),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top" if top else "bottom",
            ha="right",
            fontsize=7,
            color=color,
        )


def _step_range(data: PlotData) -> tuple[float, float]:
    steps = [s for points in data.series.values() for s, _ in points]
    steps += [x for _, x in data.attempts]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    pad = max(0.5, (hi - lo) * 0.02)
    return lo - pad, hi + pad


def write_png(data: PlotData, out: Path, title: str) -> None:
    """Draw and save; ConfigError (one line) when there is nothing to draw or no place to
    write it."""
    if not any(data.series.values()):
        raise ConfigError(f"run {title!r} has logged no metrics yet: nothing to plot")
    if not Path(out).parent.is_dir():
        raise ConfigError(f"cannot write {out}: directory {Path(out).parent} does not exist")
    fig = build_figure(data, title)
    try:
        fig.savefig(out, dpi=100)
    except (OSError, ValueError) as e:  # read-only place, unknown extension
        raise ConfigError(f"cannot write {out}: {e}") from None
    finally:
        _pyplot().close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:  # a dependency: only a damaged environment gets here
        raise ConfigError(
            "--plot needs matplotlib, which grpo_hpc installs: repair the environment with "
            "pip install matplotlib"
        ) from None

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    return plt
