"""Every script's command line; ``train.py``'s is generated from ``RunConfig``. Imports nothing heavy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from project import SWEEP_SAMPLERS, SWEEP_STORAGE, __version__
from project.config.schema import (
    ACCELERATORS,
    PRECISIONS,
    RunConfig,
    load_yaml,
    resolve_config_and_given,
    settings_of,
)
from project.config.validators import (
    count_or_auto,
    flag,
    flag_or_auto,
    flag_value,
    folder_name,
    image_file,
    non_negative_int,
    one_of,
    output_folder,
    parse_text,
    positive_int,
    size_or_share,
)
from project.contract import Recipe
from project.errors import UsageError, hide_credentials_of, redact, terminal_safe

GROUPS = ("hardware", "recipe", "model", "data", "run")
EPILOG = """\
Any other lightning.Trainer argument, as with LightningCLI:
  --trainer.KEY VALUE or --trainer.KEY=VALUE, e.g. --trainer.accumulate_grad_batches 4,
  --trainer.gradient_clip_val=0.5, --trainer.limit_train_batches 0.1, --trainer.profiler simple.
  In a --config file: a `trainer:` mapping. Keys and values are checked against Trainer's signature.
"""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, like the rest of the template's, and that remembers each
    credential it is given (``errors.hide_credentials_of``) before anything can print it."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        for token in sys.argv[1:] if args is None else args:
            text = str(token)
            hide_credentials_of(text.partition("=")[2] if text.startswith("--") else text)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {terminal_safe(redact(message))}\n")


def argparse_type(check: Callable[[Any], Any]) -> Callable[[str], Any]:
    """A setting's check as an argparse ``type``: its ValueError becomes argparse's message."""
    def convert(text: str) -> Any:
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = getattr(check, "__name__", "value")
    return convert


def _is_on_off(check: Any) -> bool:
    """A setting checked by ``flag`` takes ``--x/--no-x``, also where the recipe's option wraps the check once."""
    return any(candidate in (flag, flag_or_auto) for candidate in (check, getattr(check, "__wrapped__", None)))


def build_parser(recipe: Recipe) -> OneLineParser:
    """Flags named after ``RunConfig`` fields and the recipe's options; defaults stay out of the namespace so a
    config file can set them."""
    parser = OneLineParser(
        prog="train.py", description=recipe.description,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for name, spec in settings_of(recipe).items():
        default = spec.default
        whose = ", the recipe's" if name in recipe.defaults else ""
        shown = "" if default is None or default is False else f" (default: {flag_value(default)}{whose})"
        options: dict[str, Any] = {"help": (spec.help + shown).strip() or None}
        if _is_on_off(spec.check):
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(type=argparse_type(spec.check), metavar=spec.metavar or name.upper())
            if spec.const is not None:
                options.update(nargs="?", const=spec.const)
        groups[spec.group].add_argument("--" + name.replace("_", "-"), **options)
    presets = ", ".join(recipe.presets()) or "none"
    groups["run"].add_argument("--config", metavar="FILE.yaml|PRESET",
                               help="read settings from a YAML file (keys: flag names), or one of the recipe's presets "
                                    f"({presets}); the command line overrides it")
    return parser


def config_path(given: str, recipe: Recipe) -> str:
    """``--config``'s file: a path, or the name of one of the recipe's presets (``configs/NAME.yaml`` in it)."""
    presets = recipe.presets()
    if given in presets and not Path(given).exists():
        return str(presets[given])
    if not Path(given).exists() and "/" not in given and not given.endswith((".yaml", ".yml")):
        raise UsageError(f"--config {given}: no such file, and not one of the recipe's presets "
                         f"({', '.join(presets) or 'it has none'})")
    return given


def split_trainer_args(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Take ``--trainer.KEY VALUE`` / ``--trainer.KEY=VALUE`` out of ``argv``; values typed as YAML reads them."""
    rest: list[str] = []
    trainer: dict[str, Any] = {}
    tokens = iter(argv)
    for token in tokens:
        if not token.startswith("--trainer."):
            rest.append(token)
            continue
        key, equals, value = token.removeprefix("--trainer.").partition("=")
        if not equals:
            following = next(tokens, None)
            if following is None or following.startswith("--"):
                raise UsageError(f"--trainer.{key}: needs a value, e.g. --trainer.{key} VALUE")
            value = following
        if not key:
            raise UsageError("--trainer.: name a Trainer argument, e.g. --trainer.accumulate_grad_batches 4")
        trainer[key] = parse_text(value)
    return rest, trainer


def parse_run_command(recipe: Recipe, argv: Sequence[str] | None = None) -> tuple[RunConfig, frozenset[str]]:
    """The recipe's defaults, then the ``--config`` file, then the command line: the run's ``RunConfig``, and the
    settings the command named (flags, config file keys): a resume takes the others from the run it continues."""
    parser = build_parser(recipe)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rest, trainer = split_trainer_args(argv)
        given = vars(parser.parse_args(rest))
        layers: list[tuple[Mapping[str, Any], str]] = []
        config_file = given.pop("config", None)
        if config_file is not None and not config_file.strip():
            raise UsageError("--config: needs a YAML file or a preset's name, got an empty one")
        if config_file:
            layers.append((load_yaml(config_path(config_file, recipe), f"--config {config_file}"),
                           f"--config {config_file}"))
        layers.append(({**given, "trainer": trainer}, ""))
        return resolve_config_and_given(layers, recipe)
    except UsageError as err:
        parser.error(str(err))


# ---------------------------------------------------------------- the other scripts' command lines

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
    parser.add_argument("--only", default="all", help="rows to run: all (but template-compile), or e.g. "
                        "hand,template-auto,template-compile")
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
