#!/usr/bin/env python
"""Train the recipe's model, test its best checkpoint, export ``model.pth`` and print a summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.config.cli import parse_run_command  # noqa: E402  (light: no torch)
from project.config.schema import RunConfig  # noqa: E402
from project.contract import Recipe, installed_recipe  # noqa: E402
from project.errors import run_cli, say  # noqa: E402


def main(recipe: Recipe, config: RunConfig, given: frozenset[str], started: float) -> int:
    if config.resume:
        from project.reliability.resume import adopt_run_settings

        config = adopt_run_settings(config, given, recipe)
    if config.print_config:
        import yaml

        from project.config.schema import resolve_data_dir

        used = {**config.to_mapping(), "data_dir": str(resolve_data_dir(config.data_dir).resolve())}  # as the run would
        say(yaml.safe_dump(used, sort_keys=False).rstrip())
        return 0
    from project.training.run import test_line, train

    printed = []  # the test metrics, as soon as they exist: nothing that fails later can lose them

    def print_test_metrics(metrics: dict[str, float]) -> None:
        say(test_line(metrics))
        printed.append(True)

    result = train(config, recipe, on_tested=print_test_metrics)
    if result.is_global_zero:
        say(f"{result.summary(with_test_metrics=not printed)}\nwall time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    RECIPE = installed_recipe()
    config, given = parse_run_command(RECIPE)
    run_cli(lambda: main(RECIPE, config, given, started), "train.py", debug=config.debug)
