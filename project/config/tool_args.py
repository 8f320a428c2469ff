"""The command lines of the scripts other than ``train.py`` (whose command line is ``cli.py``'s). Imports nothing
heavy: every ``--help`` answers at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from project import SWEEP_SAMPLERS, SWEEP_STORAGE
from project.config.cli import OneLineParser, argparse_type
from project.config.schema import ACCELERATORS, PRECISIONS
from project.config.validators import (
    count_or_auto,
    folder_name,
    non_negative_int,
    one_of,
    positive_int,
    shown,
    size_or_share,
    text,
)
from project.contract import Recipe

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what the figures' files can be (matplotlib writes them)


def _writable_folder(folder: Any, what: str) -> None:
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what} in {folder} ({existing} is not a folder this user can write in)")


def image_file(value: Any) -> str:
    """A figure's file: a suffix matplotlib writes, in a folder that exists and can be written."""
    path = Path(text(value))
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"{shown(str(path))}: name a {', '.join(IMAGE_SUFFIXES)} file")
    if not path.parent.is_dir():
        raise ValueError(f"{shown(str(path))}: the folder {path.parent} does not exist")
    _writable_folder(path.parent, "the figure")
    return str(path)


def output_folder(value: Any) -> str:
    """A folder for a script's reports: it may not exist yet, but it must be possible to make and write."""
    path = Path(text(value))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{shown(str(path))}: is a file, not a folder")
    _writable_folder(path, "the reports")
    return str(path)


def _tool_parser(prog: str, description: str | None) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def _model_source(parser: argparse.ArgumentParser, recipe: Recipe) -> None:
    """Where evaluate.py and predict.py take their model from."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", metavar="PATH|best|last", help="a checkpoint, or best/last of the newest run "
                        "(default: best)")
    source.add_argument("--weights", metavar="model.pth", help="an exported model.pth")
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--name", default=recipe.name, type=argparse_type(folder_name))


def parse_evaluate_args(recipe: Recipe, description: str | None) -> argparse.Namespace:
    parser = _tool_parser("evaluate.py", description)
    _model_source(parser, recipe)
    parser.add_argument("--data-dir", help=recipe.data_help)
    parser.add_argument("--images", metavar="DIR", help="measure on a folder of class folders of image files instead "
                        "(each folder named as its class), each file read as predict.py reads it")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", metavar="PNG", type=argparse_type(image_file),
                        help="also draw the confusion matrix to this file (.png, .pdf, .svg, .jpg)")
    return parser.parse_args()


def parse_check_recipe_args(description: str | None) -> argparse.Namespace:
    parser = _tool_parser("check_recipe.py", description)
    parser.add_argument("--data-dir", help="the recipe's data (default: its example data, written to a temporary "
                        "folder)")
    parser.add_argument("--max-epochs", type=argparse_type(positive_int),
                        help="the short run's epochs (default: the recipe's, at most 4)")
    parser.add_argument("--no-learn", action="store_true", help="skip the two training checks (seconds, not a run)")
    return parser.parse_args()


def parse_new_recipe_args(description: str | None) -> argparse.Namespace:
    parser = _tool_parser("new_recipe.py", description)
    parser.add_argument("name", type=argparse_type(folder_name), help="the recipe's name, and its package's")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="DIR", help="a folder of class folders of images (or train/ and test/ "
                        "holding them), any sizes, grey or colour")
    source.add_argument("--from", dest="from_package", metavar="PACKAGE", help="copy this recipe package instead "
                        "(dotted, as PROJECT_RECIPE names it: tests.second_recipe)")
    parser.add_argument("--out", default=".", help="the folder to write the package NAME in (default: here; "
                        "PROJECT_RECIPE=NAME finds it when the scripts run from here)")
    return parser.parse_args()


def parse_predict_args(recipe: Recipe, description: str | None) -> argparse.Namespace:
    parser = _tool_parser("predict.py", description)
    parser.add_argument("inputs", nargs="+", metavar="IMAGE|DIR")
    _model_source(parser, recipe)
    parser.add_argument("--topk", type=argparse_type(positive_int), default=1, help="show the K most likely classes")
    parser.add_argument("--json", action="store_true", help="one JSON document with every result")
    return parser.parse_args()


def parse_sweep_args(recipe: Recipe, description: str | None) -> argparse.Namespace:
    parser = _tool_parser("sweep.py", description)
    parser.add_argument("--space", default=str(recipe.folder / "sweep.yaml"),
                        help="search space (YAML; default: the recipe's sweep.yaml)")
    parser.add_argument("--n-trials", type=argparse_type(positive_int), default=20,
                        help="trials this command runs (shared out among its workers)")
    parser.add_argument("--storage", help=f"a journal file (one machine; default: LOGDIR/sweeps/{SWEEP_STORAGE}) or a "
                        "database URL, e.g. postgresql://user:pw@host/db (several machines)")
    parser.add_argument("--workers", type=argparse_type(count_or_auto), default="auto",
                        help="trials run at once, each worker pinned to its own devices (auto: one per GPU, "
                             "or per group of GPUs a trial uses; one on CPU)")
    parser.add_argument("--heartbeat", type=argparse_type(positive_int), default=60,
                        help="seconds between a database trial's heartbeats; one silent for twice this is failed "
                             "and retried")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # started by a sweep: no report
    parser.add_argument("--study-name", default=f"{recipe.name}-sweep", type=argparse_type(folder_name),
                        help="the study (and its folder LOGDIR/sweeps/STUDY)")
    parser.add_argument("--pruner", default="median", choices=("median", "halving", "none"))
    parser.add_argument("--sampler", default="tpe", choices=SWEEP_SAMPLERS,
                        help="Optuna's TPE, random search, or a grid that runs each combination once")
    parser.add_argument("--sampler-seed", type=int, help="seed Optuna's sampler")
    parser.add_argument("--data-dir", help=recipe.data_help)
    parser.add_argument("--logdir", default="lightning_logs", help="trials log to LOGDIR/sweeps/STUDY/trials/")
    parser.add_argument("--val-size", type=argparse_type(size_or_share),
                        help="samples (or a share) held out for validation (default: the space's fixed, else the "
                             "recipe's)")
    parser.add_argument("--accelerator", choices=ACCELERATORS, help="(default: the space's fixed, else auto)")
    args = parser.parse_args()
    if args.storage is None:
        args.storage = str(Path(args.logdir) / "sweeps" / SWEEP_STORAGE)
    return args


def parse_benchmark_args(recipe: Recipe, description: str | None) -> argparse.Namespace:
    parser = _tool_parser("benchmark.py", description)
    count = argparse_type(positive_int)
    parser.add_argument("--batch-size", type=count, default=64)
    parser.add_argument("--epochs", type=count, default=3, help="timed epochs; each row trains one more first, "
                        "untimed (warm-up: allocations, kernel selection, capture)")
    parser.add_argument("--accelerator", default="auto", choices=ACCELERATORS)
    parser.add_argument("--precision", default="32", type=argparse_type(one_of(*PRECISIONS)))
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--data-dir", help=recipe.data_help)
    data.add_argument("--example-data", type=count, metavar="N", help="the recipe's example data instead: N "
                      "training samples (and N/4 test) written to a temporary folder")
    parser.add_argument("--limit", type=count, help="train on only this many samples (smoke tests)")
    parser.add_argument("--val-size", type=argparse_type(size_or_share), metavar="N|SHARE",
                        help="samples (or a share) held out for validation (default: the recipe's; with "
                             "--example-data, 0.2)")
    parser.add_argument("--num-workers", type=argparse_type(non_negative_int), metavar="N",
                        help="DataLoader workers of the per-sample rows (default: the run's)")
    parser.add_argument("--repeat", type=count, default=1, metavar="N",
                        help="run the rows N times, interleaved (hand, bare, template, hand, ...); each row's "
                             "time and ratios are the medians, the ratios with their range")
    parser.add_argument("--only", default="all", help="rows to run: all (but those only named run: hand-unfused, "
                        "template-compile, bare-ddp, template-ddp), or e.g. hand,template-auto,template-compile")
    parser.add_argument("--time-to-accuracy", action="store_true",
                        help="also time the whole default scripts/train.py command, imports included")
    parser.add_argument("--out", default="benchmark-results", type=argparse_type(output_folder),
                        help="folder for benchmark.json/.md/.png")
    return parser.parse_args()


def parse_runs_args(recipe: Recipe, description: str | None) -> argparse.Namespace:
    parser = _tool_parser("runs.py", description)
    parser.add_argument("--logdir", default="lightning_logs")
    parser.add_argument("--name", default=recipe.name, type=argparse_type(folder_name))
    return parser.parse_args()


def parse_check_gpu_args(description: str | None) -> argparse.Namespace:
    parser = _tool_parser("check_gpu.py", description)
    parser.add_argument("--json", action="store_true", help="print the same facts as JSON")
    parser.add_argument("--bench", action="store_true", help="time a matmul on each device (TFLOP/s)")
    return parser.parse_args()


def parse_engine_size_args(description: str | None) -> argparse.Namespace:
    return _tool_parser("engine_size.py", description).parse_args()


def parse_plot_scalars_args(description: str | None, default_tags: Sequence[str]) -> argparse.Namespace:
    parser = _tool_parser("plot_scalars.py", description)
    parser.add_argument("run", help="a run folder, e.g. lightning_logs/NAME/version_0")
    parser.add_argument("--out", default="scalars.png", type=argparse_type(image_file))
    parser.add_argument("--tags", default=",".join(default_tags), help="comma-separated scalar tags")
    return parser.parse_args()
