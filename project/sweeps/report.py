"""What a sweep leaves behind: the best-trials table, ``best.yaml`` and the study's plots."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import optuna
import yaml

from project.config.schema import resolve_config
from project.contract import Recipe
from project.errors import first_line, redact, redact_values
from project.results.plots import pyplot


def report(study: optuna.Study, recipe: Recipe, fixed: dict[str, Any], folder: Path, top: int = 5) -> str:
    """Best-trials table, ``best.yaml`` for ``train.py --config``, history and importance plots."""
    folder.mkdir(parents=True, exist_ok=True)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    counts = {s.name.lower(): sum(t.state == s for t in study.trials) for s in optuna.trial.TrialState}
    lines = [f"study {study.study_name}: {len(study.trials)} trials "
             f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)})"]
    ended = [t.duration.total_seconds() for t in study.trials if t.duration is not None
             and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    if ended:
        lines.append(f"time per trial {in_words(statistics.fmean(ended))} on average ({len(ended)} ended; "
                     "pruned ones are shorter)")
    if not done:
        return "\n".join(lines + ["no trial completed yet"])
    best = sorted(done, key=lambda t: float(t.value or 0.0), reverse=True)[:top]  # completed: each has its value
    keys = sorted({k for t in best for k in t.params})
    lines += ["", "| trial | val/acc | " + " | ".join(keys) + " |", "|---:|---:|" + "---|" * len(keys)]
    lines += [f"| {t.number} | {t.value:.4f} | " + " | ".join(_fmt(t.params.get(k)) for k in keys) + " |"
              for t in best]
    best_config = resolve_config([(fixed, "fixed"), (best[0].params, "params")], recipe)
    config = {k: v for k, v in best_config.to_mapping().items() if k not in ("data_dir", "logdir", "name")}
    (folder / "best.yaml").write_text(
        f"# best of study {study.study_name}: trial {best[0].number}, val/acc {best[0].value:.4f}\n"
        + yaml.safe_dump(redact_values(config), sort_keys=False))
    lines += ["", f"best config  {folder / 'best.yaml'}  (train.py --config {folder / 'best.yaml'})"]
    lines += _plots(study, folder)
    text = redact("\n".join(lines))
    (folder / "best_trials.md").write_text(text + "\n")
    return text


def in_words(seconds: float) -> str:
    """38 s, 4 min 10 s, 1 h 5 min: as long as a reader needs."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) and not math.isnan(value) else str(value)


def _plots(study: optuna.Study, folder: Path) -> list[str]:
    plt = pyplot()
    from optuna.visualization import matplotlib as optuna_plots

    written = []
    for name, plot in (("history", optuna_plots.plot_optimization_history),
                       ("importance", optuna_plots.plot_param_importances)):
        try:
            axes = plot(study)
        except (ValueError, RuntimeError) as err:  # e.g. importance needs two completed trials
            written.append(f"{name} plot skipped: {first_line(err)}")
            continue
        drawn: Any = axes  # one Axes, or an array of them (matplotlib's own types say neither)
        figure = drawn.figure if hasattr(drawn, "figure") else drawn[0].figure
        figure.set_size_inches(8, 4.5)
        figure.tight_layout()
        figure.savefig(folder / f"{name}.png", dpi=110)
        plt.close(figure)
        written.append(f"{name} plot  {folder / f'{name}.png'}")
    return written
