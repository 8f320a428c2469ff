"""``train.py``'s command line, generated from ``RunConfig``, and the one-line parser every script uses (the others'
command lines: ``tool_args.py``). Imports nothing heavy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from project import __version__
from project.config.schema import RunConfig, resolve_config_and_given, settings_of
from project.config.validators import flag, flag_or_auto, flag_value, parse_text
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
            from project.config.yaml_files import load_yaml

            layers.append((load_yaml(config_path(config_file, recipe), f"--config {config_file}"),
                           f"--config {config_file}"))
        layers.append(({**given, "trainer": trainer}, ""))
        return resolve_config_and_given(layers, recipe)
    except UsageError as err:
        parser.error(str(err))
