"""grpo-status --plot: the series it draws (pure) and the PNG it writes from a real run's
metrics (bench/results/demo_cpu_2026-11-25_metrics.jsonl, logged by the demo on a CPU)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.status.plot import OVERLAYS, PANELS, build_figure, plot_data, write_png
from tests.conftest import REPO, run_cli

DEMO_METRICS = REPO / "bench" / "results" / "demo_cpu_2026-11-25_metrics.jsonl"


def _metrics() -> list[dict]:
    return [json.loads(line) for line in DEMO_METRICS.read_text().splitlines() if line.strip()]


def _jobs_with_resume_at(metrics: list[dict], step: int) -> list[dict]:
    """Two attempts: the second submitted right after ``step`` was logged."""
    t = next(m["time"] for m in metrics if m.get("step") == step and "reward/mean" in m)
    return [
        {"job_id": "11", "attempt": 0, "submitted_at": metrics[0]["time"] - 5},
        {"job_id": "12", "attempt": 1, "submitted_at": t + 1},
    ]


def test_plot_data_series_and_attempts() -> None:
    metrics = [
        {"time": 10.0, "step": 1, "reward/mean": 0.5, "reward/std": 0.1, "kl": 0.0},
        {"time": 11.0, "step": 2, "reward/mean": 0.7, "reward/std": 0.2, "kl": None},
        {"time": 12.0, "step": 2, "eval/accuracy": 0.25},
        {"time": 30.0, "step": 3, "reward/mean": 0.9, "gen_len/mean": 40.0},
    ]
    jobs = [{"attempt": 0, "submitted_at": 1.0}, {"attempt": 1, "submitted_at": 20.0}]
    data = plot_data(metrics, jobs + [{"attempt": 2, "submitted_at": 99.0}])
    assert data.series["reward/mean"] == [(1, 0.5), (2, 0.7), (3, 0.9)]
    assert data.series["kl"] == [(1, 0.0)]  # a null (non-finite) value is not a point
    assert data.series["eval/accuracy"] == [(2, 0.25)]
    assert data.reward_std == [(1, 0.1), (2, 0.2)]
    # attempt 1 first logged step 3; attempt 2 has logged nothing yet: after the last step
    assert data.attempts == [(1, 2.5), (2, 3.5)]


def test_figure_has_one_panel_per_metric_and_attempt_lines() -> None:
    metrics = _metrics()
    data = plot_data(metrics, _jobs_with_resume_at(metrics, 15))
    data.reward_std = [(s, 0.1) for s, _ in data.series["reward/mean"]]
    fig = build_figure(data, "demo")
    try:
        axes = fig.get_axes()
        assert [ax.get_title() for ax in axes] == [title for _, title in PANELS]
        logged = [key for key, _ in PANELS if data.series.get(key)]
        # A CPU run (HF generate) reports no engine log-probs: that panel says "not logged".
        assert [k for k, _ in PANELS if k not in logged] == ["rollout/engine_kl"]
        for ax, (key, _) in zip(axes, PANELS, strict=True):
            assert ax.get_xlabel() == "step"
            if key not in logged:
                assert [t.get_text() for t in ax.texts] == ["not logged"]
                continue
            curve, *others = ax.get_lines()
            assert len(curve.get_xdata()) == len(data.series[key]) > 0
            overlays = [line for line in others if line.get_label() == OVERLAYS.get(key)]
            assert len(overlays) == (1 if data.series.get(OVERLAYS.get(key, ""), []) else 0)
            attempt_lines = [line for line in others if line not in overlays]
            assert [line.get_xdata()[0] for line in attempt_lines] == [15.5]
        assert len(axes[0].collections) == 1  # the reward spread band
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", head[16:24])


def test_grpo_status_plot_writes_a_png(logs_dir: Path, tmp_path: Path) -> None:
    metrics = _metrics()
    run = logs_dir / "demo"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(DEMO_METRICS.read_text())
    for job in _jobs_with_resume_at(metrics, 15):
        append_jsonl(run / "jobs.jsonl", {**job, "executor": "slurm"})
    out = tmp_path / "curves.png"
    result = run_cli("grpo_hpc.cli.status:main", "demo", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert _png_size(out) == (1500, 900)
    import matplotlib.image

    pixels = matplotlib.image.imread(out)  # decodes: a whole, valid image
    assert pixels.shape[:2] == (900, 1500) and pixels.std() > 0


@pytest.mark.parametrize(
    ("metrics", "out", "message"),
    [
        ([], "x.png", "has logged no metrics yet"),
        ([{"step": 1, "time": 1.0, "reward/mean": 0.5}], "missing/x.png", "does not exist"),
        ([{"step": 1, "time": 1.0, "reward/mean": 0.5}], "x.unknownformat", "cannot write"),
    ],
)
def test_plot_errors_are_one_line(tmp_path: Path, metrics: list, out: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        write_png(plot_data(metrics, []), tmp_path / out, "r")


def test_step_metrics_reports_reward_spread() -> None:
    from grpo_hpc.config.load import build_config
    from grpo_hpc.train.measure.tracking import step_metrics

    rewards = [0.0, 1.0, 1.0, 0.0]
    sums = [sum(rewards), len(rewards), 40.0, 2.0, sum(r * r for r in rewards), 2.0]
    m = step_metrics(3, build_config("tiny", []), sums, ["correctness"], 1)
    assert m["reward/mean"] == 0.5 and m["reward/std"] == pytest.approx(0.5)
    assert m["reward/correctness"] == 0.5
    assert m["gen_len/mean"] == 10.0  # 40 tokens over the 4 completions
    # Dynamic sampling generated 8 completions (two rounds) for the 4 kept: the mean
    # length is over the 8 the 40 tokens came from.
    two_rounds = step_metrics(3, build_config("tiny", []), sums, ["correctness"], 1, 8.0)
    assert two_rounds["gen_len/mean"] == 5.0 and two_rounds["reward/mean"] == 0.5
    split = build_config("tiny", ["algo.max_staleness=1", "rollout.placement=split"])
    assert step_metrics(3, split, sums, ["correctness"], 1)["generators"] == 1  # beside 1 trainer
    assert "generators" not in m


BETA_METRICS = Path(__file__).with_name("data") / "tiny_beta_metrics.jsonl"
"""metrics.jsonl of a real 6-step tiny run with algo.beta=0.04 (CPU): its KL is 0.0 at
step 1, while the policy still is the reference, and above 0 after."""


def _run_dir(root: Path, name: str, metrics: Path, beta: float) -> RunPaths:
    """A run directory of real files: the run's metrics, and its config.yaml as grpo-submit
    writes it (the config writer, ``algo.beta`` set)."""
    from grpo_hpc.config.load import build_config, to_yaml

    paths = RunPaths(root / name)
    paths.root.mkdir(parents=True)
    paths.config.write_text(to_yaml(build_config("tiny", [f"algo.beta={beta}"])))
    paths.metrics.write_text(metrics.read_text())
    append_jsonl(paths.jobs, {"job_id": "11", "attempt": 0, "submitted_at": 1.0})
    return paths


def _figure_of(paths: RunPaths) -> tuple[list[str], list[str], dict]:
    """(panel titles, the spare cells' notes, KL series) of the figure grpo-status draws."""
    from grpo_hpc.core.fsutil import read_jsonl
    from grpo_hpc.status.report import run_beta

    data = plot_data(read_jsonl(paths.metrics), read_jsonl(paths.jobs), run_beta(paths))
    fig = build_figure(data, paths.name)
    try:
        axes = fig.get_axes()
        titles = [ax.get_title() for ax in axes if ax.axison]
        notes = [t.get_text() for ax in axes if not ax.axison for t in ax.texts]
        kl = {
            ax.get_title(): list(ax.get_lines()[0].get_ydata())
            for ax in axes
            if ax.get_title() == "KL to reference"
        }
        return titles, notes, kl
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_kl_panel_only_for_a_run_with_a_reference(tmp_path: Path) -> None:
    """algo.beta 0 (the demo run: its KL is 0.0 at every step) draws no KL panel and says
    why in the spare cell; beta > 0 draws it, from step 1's 0.0 on."""
    from grpo_hpc.status.plot import NO_REFERENCE
    from grpo_hpc.status.report import run_beta

    no_ref = _run_dir(tmp_path, "demo", DEMO_METRICS, 0.0)
    ref = _run_dir(tmp_path, "beta", BETA_METRICS, 0.04)
    assert (run_beta(no_ref), run_beta(ref)) == (0.0, 0.04)

    titles, notes, kl = _figure_of(no_ref)
    assert titles == [t for k, t in PANELS if k != "kl"] and kl == {}
    assert notes == [NO_REFERENCE]

    titles, notes, kl = _figure_of(ref)
    assert titles == [t for _, t in PANELS] and notes == []
    logged = [m["kl"] for m in map(json.loads, BETA_METRICS.read_text().splitlines()) if "kl" in m]
    assert kl["KL to reference"] == logged and logged[0] == 0.0 and max(logged) > 0


def test_kl_panel_decision() -> None:
    """The config decides, not the metrics (a reference run's first KL is 0.0 too); a run
    with no readable config.yaml keeps the panel, as before."""
    from grpo_hpc.status.plot import has_reference

    assert has_reference(0.0) is False
    assert has_reference(0.04) is True
    assert has_reference(None) is True


def test_run_without_readable_config_keeps_the_kl_panel(tmp_path: Path) -> None:
    from grpo_hpc.status.report import run_beta

    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    assert run_beta(paths) is None  # no config.yaml
    paths.config.write_text("algo: [not, a, mapping\n")
    assert run_beta(paths) is None  # broken YAML: a plot all the same


def test_grpo_status_plot_reads_beta_from_the_run(tmp_path: Path) -> None:
    """The command line reads the run's config.yaml: the same metrics plot without the KL
    panel under beta 0 and with it under beta > 0, in a PNG of the same size."""
    import matplotlib.image

    pixels = {}
    for beta in (0.0, 0.04):
        logs = tmp_path / f"logs-{beta}"
        _run_dir(logs, "demo", DEMO_METRICS, beta)
        out = tmp_path / f"curves-{beta}.png"
        result = run_cli(
            "grpo_hpc.cli.status:main", "demo", "--plot", str(out), "--logs", str(logs)
        )
        assert result.returncode == 0, result.stderr
        assert _png_size(out) == (1500, 900)
        pixels[beta] = matplotlib.image.imread(out)
    assert (pixels[0.0] != pixels[0.04]).any()


ASYNC_METRICS = REPO / "tests" / "fixtures" / "async_tiny_cpu" / "metrics.jsonl"
"""A real asynchronous run's metrics (tiny, algo.max_staleness=1, 4 steps on a CPU; the
command is in command.txt beside it): step 1 trains samples of staleness 0, steps 2-4 of 1."""


def test_an_async_run_gets_staleness_and_importance_weight_panels(tmp_path: Path) -> None:
    from grpo_hpc.status.plot import ASYNC_PANELS, NO_REFERENCE, STALENESS_MEAN

    rows = [json.loads(x) for x in ASYNC_METRICS.read_text().splitlines()]
    data = plot_data(rows, [])
    assert data.asynchronous
    assert data.series[STALENESS_MEAN] == [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0)]
    assert data.series["staleness/max"] == [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0)]
    logged = [(r["step"], r["rollout/is_weight_max"]) for r in rows if "rollout/is_weight_max" in r]
    assert data.series["rollout/is_weight_max"] == logged and len(logged) == 4
    titles, notes, _ = _figure_of(_run_dir(tmp_path, "async", ASYNC_METRICS, 0.0))
    assert titles == [t for k, t in PANELS if k != "kl"] + [t for _, t in ASYNC_PANELS]
    assert notes == [NO_REFERENCE]  # 11 panels in a 4 x 3 grid: the spare cell says why


def test_the_weight_panel_draws_the_mean_and_the_largest_weight(tmp_path: Path) -> None:
    from grpo_hpc.core.fsutil import read_jsonl
    from grpo_hpc.status.plot import ASYNC_PANELS

    rows = read_jsonl(ASYNC_METRICS)
    fig = build_figure(plot_data(rows, []), "async")
    try:
        panel_of = {ax.get_title(): ax for ax in fig.get_axes()}
        weights = panel_of[ASYNC_PANELS[1][1]].get_lines()
        mean = [r["rollout/is_weight_mean"] for r in rows if "rollout/is_weight_mean" in r]
        top = [r["rollout/is_weight_max"] for r in rows if "rollout/is_weight_max" in r]
        assert [list(line.get_ydata()) for line in weights] == [mean, top]
        assert weights[1].get_linestyle() == "--"
        stale = panel_of[ASYNC_PANELS[0][1]].get_lines()
        assert [list(line.get_ydata()) for line in stale] == [[0.0, 1.0, 1.0, 1.0]] * 2
        assert panel_of[ASYNC_PANELS[2][1]].get_ylim() == (-0.03, 1.03)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_cap_panel_draws_the_completions_sequence_masking_dropped() -> None:
    """With ``algo.offpolicy_mask`` the run logs the share of completions it dropped: drawn
    dashed in the panel of the tokens the weight cap cut (both shares, 0..1); a run with it
    off logs none, and the panel keeps its one line."""
    from grpo_hpc.status.plot import ASYNC_PANELS

    rows = [
        {"step": s, "time": float(s), "reward/mean": 0.1, "staleness/0": 0.0, "staleness/1": 8.0,
         "staleness/max": 1, "rollout/is_clipped_frac": 0.01 * s,
         "rollout/offpolicy_masked_frac": 0.125 * s}
        for s in (1, 2, 3)
    ]  # fmt: skip
    for logged, lines in ((rows, 2), ([dict(r) for r in rows], 1)):
        if lines == 1:
            for r in logged:
                del r["rollout/offpolicy_masked_frac"]
        fig = build_figure(plot_data(logged, []), "opsm")
        try:
            panel = {ax.get_title(): ax for ax in fig.get_axes()}[ASYNC_PANELS[2][1]]
            drawn = [line for line in panel.get_lines() if len(line.get_ydata())]
            assert len(drawn) == lines
            if lines == 2:
                assert list(drawn[1].get_ydata()) == [0.125, 0.25, 0.375]
                assert drawn[1].get_linestyle() == "--"
        finally:
            import matplotlib.pyplot as plt

            plt.close(fig)


def test_no_async_panel_without_a_staleness_histogram() -> None:
    """A synchronous run on the native engine logs importance weights too (all 1, from the
    sampler's log-probs) but no staleness: its figure keeps its nine panels."""
    sync = [{"step": 1, "time": 1.0, "reward/mean": 0.1, "rollout/is_weight_mean": 1.0}]
    data = plot_data(sync, [])
    assert not data.asynchronous and len(data.panels()) == len(PANELS)
    assert not plot_data(_metrics(), []).asynchronous


def test_grpo_status_plot_of_an_async_run_is_four_rows_high(tmp_path: Path) -> None:
    _run_dir(tmp_path / "logs", "async", ASYNC_METRICS, 0.0)
    out = tmp_path / "curves.png"
    result = run_cli(
        "grpo_hpc.cli.status:main", "async", "--plot", str(out), "--logs", str(tmp_path / "logs")
    )
    assert result.returncode == 0, result.stderr
    assert _png_size(out) == (1500, 1200)
