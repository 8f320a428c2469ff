"""Command-line flags of ``scripts/train.py``; imports nothing heavy so ``--help`` is instant."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from project import LOADERS, OPTIMIZERS, SCHEDULERS, __version__

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
PRECISIONS = ("32", "32-true", "64", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "16", "bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
BASE_BATCH = 256  # the batch the default --lr is tuned for; --scale-lr scales from it


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _number(text: str, kind: type) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a valid {kind.__name__}: {text!r}") from None


def memory_fraction(text: str) -> float:
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def hidden_sizes(text: str) -> list[int]:
    """``128`` or ``256,128``: one or more hidden layer widths."""
    parts = [p for p in text.replace(" ", "").split(",") if p]
    if not parts:
        raise argparse.ArgumentTypeError("needs at least one layer size, e.g. 128 or 256,128")
    return [positive_int(p) for p in parts]


def devices_spec(text: str) -> int | list[int] | str:
    """A count (``2``), ``-1``/``auto`` for all, or device indices (``0,1`` or ``1,``)."""
    text = text.strip()
    if text == "auto":
        return text
    if "," in text:
        try:
            indices = [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"device indices must be integers, got {text!r}") from None
        if not indices or any(i < 0 for i in indices) or len(set(indices)) != len(indices):
            raise argparse.ArgumentTypeError(f"device indices must be distinct and >= 0, got {text!r}")
        return indices
    count = _number(text, int)
    if count == 0 or count < -1:
        raise argparse.ArgumentTypeError(f"device count must be >= 1 (or -1 for all), got {text}")
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train the MNIST MLP with PyTorch Lightning, then test the best checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    hw = parser.add_argument_group("hardware")
    hw.add_argument("--accelerator", default="auto", choices=ACCELERATORS)
    hw.add_argument("--devices", type=devices_spec, default=1,
                    help="count per node (2), all (-1), or indices (0,1 or 1, for cuda:1)")
    hw.add_argument("--num-nodes", type=positive_int, default=1)
    hw.add_argument("--strategy", default="auto", help="Lightning strategy: auto, ddp, ddp_spawn, fsdp, ...")
    hw.add_argument("--precision", default="32", choices=PRECISIONS, metavar="PRECISION",
                    help="32, 64, 16-mixed, bf16-mixed, 16-true, bf16-true (16-mixed on CPU uses bf16-mixed)")
    hw.add_argument("--gpu-memory-fraction", type=memory_fraction, default=None, metavar="F",
                    help="cap each process's CUDA memory at this share of its GPU (0 < F <= 1)")
    hw.add_argument("--device-stats", action="store_true", help="log device utilisation (DeviceStatsMonitor)")
    hw.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                    help="torch.compile the model (mode; reduce-overhead uses CUDA graphs on GPU)")
    hw.add_argument("--detect-anomaly", action="store_true", help="autograd anomaly detection (slow; debugging)")

    opt = parser.add_argument_group("recipe")
    opt.add_argument("--max-epochs", type=positive_int, default=6)
    opt.add_argument("--batch-size", type=positive_int, default=256, help="per device")
    opt.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    opt.add_argument("--lr", type=positive_float, default=0.2, help="peak LR under onecycle")
    opt.add_argument("--momentum", type=non_negative_float, default=0.9, help="SGD only (Nesterov when > 0)")
    opt.add_argument("--weight-decay", type=non_negative_float, default=5e-4)
    opt.add_argument("--scheduler", default="onecycle", choices=SCHEDULERS)
    opt.add_argument("--hidden", type=hidden_sizes, default=[128], help="hidden widths, e.g. 128 or 256,128")
    opt.add_argument("--scale-lr", action="store_true",
                     help=f"linear scaling rule: lr x global batch / {BASE_BATCH}")
    opt.add_argument("--find-lr", action="store_true", help="run Lightning's LR finder first and use its pick")
    opt.add_argument("--find-batch-size", action="store_true",
                     help="run Lightning's batch-size finder first (largest batch that fits) and use it")
    opt.add_argument("--seed", type=int, default=0)
    opt.add_argument("--deterministic", action="store_true", help="use only deterministic algorithms")

    data = parser.add_argument_group("data")
    data.add_argument("--data-dir", default=None,
                      help="folder holding MNIST/raw/ (default: $DATA_DIR, else data/)")
    data.add_argument("--val-size", type=positive_int, default=5000,
                      help="images of the training file held out for validation (seeded split)")
    data.add_argument("--loader", default="memory", choices=LOADERS,
                      help="memory: whole split as one tensor, batches by gather; torchvision: per-sample")
    data.add_argument("--num-workers", type=non_negative_int, default=0, help="torchvision loader only")
    data.add_argument("--pin-memory", action="store_true", help="torchvision loader only")

    run = parser.add_argument_group("run")
    run.add_argument("--fast-dev-run", action="store_true", help="one batch of each stage, no logs or files")
    run.add_argument("--logdir", default="lightning_logs")
    run.add_argument("--logger", default="tensorboard",
                     help="tensorboard, csv, wandb, mlflow; several: tensorboard,csv")
    run.add_argument("--name", default="mnist", help="experiment name: runs go to LOGDIR/NAME/version_N")
    run.add_argument("--log-every-n-steps", type=positive_int, default=50)
    run.add_argument("--resume", default=None, metavar="CKPT|last",
                     help="checkpoint to continue from; 'last' = newest run's last.ckpt")
    run.add_argument("--checkpoint-every-n-steps", type=positive_int, default=None, metavar="N",
                     help="also refresh last.ckpt every N optimizer steps (it is always written each epoch)")
    run.add_argument("--export", default=None, metavar="PATH",
                     help="where to write model.pth (default: inside the run folder)")
    run.add_argument("--export-pt2", default=None, metavar="PATH",
                     help="also write a torch.export program (.pt2) that loads with torch alone")
    run.add_argument("--overwrite", action="store_true", help="let --export replace an existing file")
    run.add_argument("--config", default=None, metavar="FILE.yaml",
                     help="read flags from a YAML file (keys: flag names); the command line overrides it")
    run.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


# Flags that describe one invocation, not the experiment: never read from or saved to a config.
NOT_IN_CONFIG = ("config", "debug", "resume", "export", "export_pt2", "overwrite", "fast_dev_run")


def config_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """A YAML file of flag values as command-line tokens, so argparse checks them like typed flags."""
    import yaml

    try:
        with open(path, encoding="utf-8") as stream:
            values = yaml.safe_load(stream) or {}
    except OSError as err:
        parser.error(f"--config {path}: cannot read it ({err.strerror or err})")
    except yaml.YAMLError as err:
        parser.error(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    try:
        return values_argv(values, parser)
    except ValueError as err:
        parser.error(f"--config {path}: {err}")


def flag_names(parser: argparse.ArgumentParser) -> set[str]:
    """The keys a config or a sweep may set (``max_epochs`` style)."""
    return {a.dest for a in parser._actions if a.option_strings} - set(NOT_IN_CONFIG) - {"help", "version"}  # noqa: SLF001


def values_argv(values: dict[str, object], parser: argparse.ArgumentParser) -> list[str]:
    """Flag values (``{"max_epochs": 3}``) as tokens (``["--max-epochs", "3"]``); ValueError names a bad key."""
    actions = {a.dest: a for a in parser._actions}  # noqa: SLF001 - argparse has no public accessor
    allowed = flag_names(parser)
    tokens: list[str] = []
    for key, value in values.items():
        dest = str(key).replace("-", "_")
        if dest not in allowed:
            raise ValueError(f"unknown key {key!r} (keys are train.py flag names, e.g. max_epochs)")
        flag = actions[dest].option_strings[-1]
        if isinstance(actions[dest], argparse._StoreTrueAction):  # noqa: SLF001
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false, got {value!r}")
            tokens += [flag] if value else []
        elif value is not None:
            text = ",".join(map(str, value)) + ("," if len(value) == 1 and dest == "devices" else "") \
                if isinstance(value, list) else str(value)
            tokens += [flag, text]
    return tokens


def to_config(args: argparse.Namespace) -> dict[str, object]:
    """The resolved flags as a config mapping that ``--config`` reads back to the same run."""
    return {k: v for k, v in vars(args).items() if k not in NOT_IN_CONFIG}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        argv = config_argv(known.config, parser) + argv  # later tokens win: the command line overrides
    args = parser.parse_args(argv)
    if args.fast_dev_run and args.resume:
        parser.error("--fast-dev-run cannot be combined with --resume")
    return args
