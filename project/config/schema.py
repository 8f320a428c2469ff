"""The schema of a run: every setting with its default, check and help text, in one frozen dataclass.

The command line, ``--config`` files, the saved ``config.yaml``, sweep trials and the benchmark
all build a ``RunConfig`` against a recipe (``resolve_config(layers, recipe)``): the recipe's
defaults replace the engine's, and its options travel in ``RunConfig.options``, each checked by
its ``Option``. Nothing below the command line sees argparse, and nothing here reads the
environment. Imports nothing heavy, so ``--help`` stays instant.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from project import EVAL_BATCH_SIZE, LOGGERS, OPTIMIZERS, SCHEDULERS
from project.config.validators import (
    count_or_auto,
    devices_spec,
    flag,
    flag_or_auto,
    folder_name,
    learning_rate,
    memory_fraction,
    names_from,
    non_negative_float,
    non_negative_int,
    one_of,
    optional,
    positive_int,
    seed_value,
    shown,
    size_or_share,
    text,
    top_k,
)
from project.contract import Recipe, RecipeError
from project.errors import UsageError

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
PRECISIONS = ("32", "32-true", "64", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "16", "bf16")
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}  # Lightning's own


def full_precision(precision: str) -> str:
    """A precision as Lightning spells it out (``32`` is ``32-true``), so that it does not warn about a shorthand and
    a resume sees the same precision under both names."""
    return PRECISION_ALIASES.get(str(precision), str(precision))
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def setting(default: Any, check: Callable[[Any], Any], help: str = "", group: str = "run", *,
            const: Any = None, saved: bool = True, metavar: str | None = None, trains: bool = False) -> Any:
    """A field of ``RunConfig``: its check, help text, help group and command-line shape.

    ``saved=False`` marks what belongs to one invocation (resume, export, ...), not to the run's
    recipe: it stays out of ``config.yaml``. ``trains=True`` marks what changes what is trained: a
    resume keeps the run's value (``--resume last`` adopts it, another is refused).
    """
    metadata = {"check": check, "help": help, "group": group, "const": const, "saved": saved, "metavar": metavar,
                "trains": trains}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """What a flag, a config key and a sweep parameter share: its default, check, help and command-line shape."""

    default: Any
    check: Callable[[Any], Any]
    help: str
    group: str
    const: Any = None
    saved: bool = True
    metavar: str | None = None
    trains: bool = False


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run: the engine's settings and, in ``options``, the recipe's own.

    Field names are the flags (``max_epochs`` = ``--max-epochs``). Built by ``resolve_config`` (or
    ``RunConfig.for_recipe``), which applies the recipe's defaults; ``RunConfig()`` holds the engine's.
    """

    # hardware
    accelerator: str = setting("auto", one_of(*ACCELERATORS), "auto, cpu, gpu/cuda, mps", "hardware")
    devices: int | list[int] | str = setting(1, devices_spec, "count per node (2), every GPU (-1), or GPU "
                                             "indices (0,1 or 1, for cuda:1)", "hardware")
    oversubscribe: bool = setting(False, flag, "allow more CPU processes than twice the cores (--devices N on CPU)",
                                  "hardware", saved=False)
    num_nodes: int = setting(1, positive_int, "machines taking part (multi-node DDP)", "hardware")
    strategy: str = setting("auto", text, "Lightning strategy: auto, ddp, ddp_spawn, fsdp, ...", "hardware")
    precision: str = setting("32", one_of(*PRECISIONS), "32, 64, 16-mixed, bf16-mixed, 16-true, bf16-true "
                             "(16-mixed on CPU uses bf16-mixed)", "hardware", metavar="PRECISION", trains=True)
    gpu_memory_fraction: float | None = setting(None, optional(memory_fraction), "cap each process's CUDA memory "
                                                "at this share of its GPU (0 < F <= 1)", "hardware", metavar="F")
    device_stats: bool = setting(False, flag, "log device utilisation (DeviceStatsMonitor)", "hardware")
    compile: str | None = setting(None, optional(one_of(*COMPILE_MODES)), "torch.compile the model (mode; "
                                  "reduce-overhead uses CUDA graphs on GPU)", "hardware", const="default",
                                  metavar="MODE")
    detect_anomaly: bool = setting(False, flag, "autograd anomaly detection (slow; debugging)", "hardware")
    cuda_graphs: bool | str = setting("auto", flag_or_auto, "replay each optimizer step from a CUDA graph (auto: on "
                                      "a GPU wherever it is the same training; --no-cuda-graphs: off; on CPU, "
                                      "--cuda-graphs runs the captured step's arithmetic eagerly)", "hardware")
    steps_per_call: int | str = setting("auto", count_or_auto, "optimizer steps per Lightning step (same training, "
                                        "less Lightning overhead); auto measures", "hardware", metavar="K|auto")
    # recipe
    max_epochs: int = setting(10, positive_int, "", "recipe")
    batch_size: int = setting(64, positive_int, "per device", "recipe", trains=True)
    eval_batch_size: int = setting(EVAL_BATCH_SIZE, positive_int, "per device, for validation and test", "recipe")
    optimizer: str = setting("adamw", one_of(*OPTIMIZERS), "sgd (Nesterov when momentum > 0), adam, adamw", "recipe",
                             trains=True)
    lr: float = setting(1e-3, learning_rate, "peak LR under onecycle", "recipe", trains=True)
    momentum: float = setting(0.9, non_negative_float, "SGD only (Nesterov when > 0); under onecycle, "
                                     "the momentum cycles 0.95-0.85-0.95 instead (0 turns it off)", "recipe",
                              trains=True)
    weight_decay: float = setting(0.01, non_negative_float, "", "recipe", trains=True)
    scheduler: str = setting("cosine", one_of(*SCHEDULERS), "onecycle, cosine (with linear warm-up) or none; "
                             "per optimizer step", "recipe", trains=True)
    warmup_steps: int | None = setting(None, optional(non_negative_int), "cosine's linear warm-up (default: 5%% "
                                       "of the run's steps)", "recipe", metavar="N", trains=True)
    scale_lr: bool | str = setting("auto", flag_or_auto, "linear scaling rule: lr x global batch / the recipe's "
                                   "--batch-size (auto: when the run has several processes, whose global batch "
                                   "grows with them)", "recipe", trains=True)
    find_lr: bool = setting(False, flag, "run Lightning's LR finder first and use its pick", "recipe")
    find_batch_size: bool = setting(False, flag, "run Lightning's batch-size finder first and use it", "recipe")
    early_stopping: int | None = setting(None, optional(positive_int), "stop when val/acc has not improved for "
                                         "this many validations (EarlyStopping)", "recipe", metavar="PATIENCE")
    seed: int = setting(0, seed_value, "seeds the split, the data order and the weights", "recipe", trains=True)
    deterministic: bool = setting(False, flag, "use only deterministic algorithms", "recipe")
    # data
    data_dir: str | None = setting(None, optional(text), "the recipe's data", "data")
    val_size: int | float | None = setting(None, optional(size_or_share), "samples of the training set held out for "
                                           "validation, or a share (0.1) (default: the recipe's)", "data",
                                           metavar="N|SHARE", trains=True)
    num_workers: int = setting(0, non_negative_int, "DataLoader workers reading samples (recipes that read "
                               "per sample)", "data")
    pin_memory: bool = setting(False, flag, "pinned host memory for per-sample batches", "data")
    # run
    fast_dev_run: bool = setting(False, flag, "one batch of each stage, no logs or files", saved=False)
    logdir: str = setting("lightning_logs", text, "runs go to LOGDIR/NAME/version_N")
    logger: str = setting("tensorboard", names_from(*LOGGERS), "tensorboard, csv, wandb, mlflow; several: "
                          "tensorboard,csv")
    name: str = setting("run", folder_name, "experiment name (the folder LOGDIR/NAME)")
    run_version: str | None = setting(None, optional(folder_name), "the run folder's name under LOGDIR/NAME (default: "
                                  "the next version_N)", saved=False, metavar="NAME")
    log_every_n_steps: int = setting(50, positive_int, "how often the step loss and LR are logged")
    log_histograms: int | None = setting(None, optional(positive_int), "TensorBoard histograms of every weight and "
                                         "its last gradient, every N epochs", metavar="N")
    log_graph: bool = setting(False, flag, "the model's graph in TensorBoard's GRAPHS tab")
    resume: str | None = setting(None, optional(text), "continue the run that wrote this checkpoint, in its "
                                 "folder, with its settings; 'last' = newest run's last.ckpt; 'auto' = the "
                                 "--run-version folder's, if it has one", saved=False, metavar="CKPT|last|auto")
    init_from: str | None = setting(None, optional(text), "start a new run from this checkpoint's weights, with "
                                    "this run's settings ('last', 'best' or a path)", metavar="CKPT")
    save_top_k: int = setting(1, top_k, "how many of the best checkpoints (by val/acc) to keep; -1 keeps all",
                              metavar="K")
    checkpoint_every_n_steps: int | None = setting(None, optional(positive_int), "also refresh last.ckpt every N "
                                                   "optimizer steps", metavar="N")
    export: str | None = setting(None, optional(text), "where to write model.pth (default: the run folder)",
                                 saved=False, metavar="PATH")
    export_pt2: str | None = setting(None, optional(text), "also write a torch.export program (.pt2)",
                                     saved=False, metavar="PATH")
    overwrite: bool = setting(False, flag, "let --export/--export-pt2 replace existing files", saved=False)
    debug: bool = setting(False, flag, "show tracebacks for errors", saved=False)
    print_config: bool = setting(False, flag, "print the resolved settings as a config file would hold them, and "
                                 "exit without training", saved=False)
    # The recipe's options (its Option values by name): config.yaml holds them beside the engine's settings.
    options: dict[str, Any] = field(default_factory=dict)
    # Any other lightning.Trainer argument (--trainer.KEY VALUE), checked against its signature.
    trainer: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fast_dev_run and self.resume:
            raise UsageError("--fast-dev-run cannot be combined with --resume")
        if self.resume and self.init_from:
            raise UsageError("--resume continues a run, --init-from starts a new one from its weights: choose one")
        if (self.log_histograms or self.log_graph) and "tensorboard" not in self.logger.split(","):
            asked = "--log-histograms" if self.log_histograms else "--log-graph"
            raise UsageError(f"{asked} writes to TensorBoard: add it to the loggers "
                             f"(--logger {self.logger},tensorboard)")
        if self.warmup_steps is not None and self.scheduler != "cosine":
            raise UsageError(f"--warmup-steps applies to --scheduler cosine, not {self.scheduler}")

    @classmethod
    def for_recipe(cls, recipe: Recipe, **settings: Any) -> RunConfig:
        """A run of ``recipe``: its defaults, then ``settings`` (engine settings and options by name), checked."""
        return resolve_config([(settings, "")], recipe)

    def to_mapping(self) -> dict[str, Any]:
        """What ``config.yaml`` holds: every setting that defines the run (the options beside the engine's), not
        this invocation's extras."""
        values = {name: getattr(self, name) for name, spec in ENGINE_SETTINGS.items() if spec.saved}
        values.update(self.options)
        if self.trainer:
            values["trainer"] = self.trainer
        return values

    def value(self, name: str) -> Any:
        """A setting or an option, by name."""
        return self.options[name] if name in self.options else getattr(self, name)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes``: engine settings, checked as their flags are, and the recipe's options by name
        (checked where the recipe is known: ``resolve_config``)."""
        options = {name: changes.pop(name) for name in list(changes) if name in self.options}
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "options" and isinstance(value, Mapping):
                options = {**value, **options}
            elif name == "trainer":
                if not isinstance(value, Mapping):
                    raise UsageError(f"RunConfig.replace(trainer=...): expected a mapping of Trainer arguments, got "
                                     f"{type(value).__name__}")
                checked[name] = _trainer_args_checked(dict(value))
            elif name in ENGINE_SETTINGS:
                checked[name] = _check(ENGINE_SETTINGS[name], value, f"RunConfig.replace({name}=...)")
            else:
                raise UsageError(f"RunConfig.replace({name}=...): no such setting (settings are train.py's flags "
                                 "by their Python names, e.g. max_epochs, and the recipe's options)")
        if options:
            checked["options"] = {**self.options, **options}
        return dataclasses.replace(self, **checked)

    @property
    def wants_tuner(self) -> bool:
        return self.find_batch_size or self.find_lr

    def scales_lr(self, world_size: int) -> bool:
        """The linear scaling rule applies: asked for, or ``auto`` with several processes."""
        return self.scale_lr is True or (self.scale_lr == "auto" and world_size > 1)

    def tunes(self, world_size: int) -> bool:
        """A tuner or the scaling rule sets the batch size or LR before the run (``project.training.tuning``)."""
        return self.wants_tuner or self.scales_lr(world_size)


ENGINE_SETTINGS = {f.name: Setting(f.default if f.default_factory is dataclasses.MISSING else f.default_factory(),
                                   **f.metadata) for f in dataclasses.fields(RunConfig) if "check" in f.metadata}


def settings_of(recipe: Recipe) -> dict[str, Setting]:
    """The flags, config keys and sweep parameters of a run of ``recipe``: the engine's settings with the recipe's
    defaults in place of the engine's, then its options; a recipe that sets them wrong is one line."""
    found = dict(ENGINE_SETTINGS)
    found["name"] = dataclasses.replace(found["name"], default=recipe.name)
    found["data_dir"] = dataclasses.replace(found["data_dir"], help=recipe.data_help)
    for name, value in recipe.defaults.items():
        spec = found.get(name)
        if spec is None or not spec.saved or spec.group == "hardware" or name == "name":
            raise RecipeError(f"recipe {recipe.name!r}: defaults: {name!r} is not an engine setting a recipe sets "
                              "(e.g. batch_size, max_epochs, optimizer, lr, scheduler, val_size)")
        try:
            found[name] = dataclasses.replace(spec, default=spec.check(value))
        except ValueError as err:
            raise RecipeError(f"recipe {recipe.name!r}: defaults: {name}: {err}") from None
    for name, option in recipe.options.items():
        if name in found or name in ("options", "trainer", "config"):
            raise RecipeError(f"recipe {recipe.name!r}: options: {name!r} is already an engine setting; rename it")
        found[name] = Setting(option.default, recipe.checked_option(name), option.help, "model",
                              metavar=option.metavar)
    return found


# Settings that change what is trained (with the recipe's options): a resume keeps them.
TRAINING_SETTINGS = tuple(name for name, spec in ENGINE_SETTINGS.items() if spec.trains)


@dataclass(frozen=True)
class TrainerArgument:
    """What a ``--trainer.KEY`` argument is to the engine."""

    trains: bool  # changes what is trained: a resume keeps the run's value
    counts_steps: bool  # counts Lightning steps: a run takes one optimizer step per Lightning step (auto K is 1)


# The Trainer arguments the engine must know more of than their signature says; any other passes as it is.
TRAINER_ARGUMENTS = {
    "accumulate_grad_batches": TrainerArgument(trains=True, counts_steps=True),
    "gradient_clip_val": TrainerArgument(trains=True, counts_steps=True),
    "gradient_clip_algorithm": TrainerArgument(trains=True, counts_steps=True),
    "limit_train_batches": TrainerArgument(trains=True, counts_steps=True),
    "max_steps": TrainerArgument(trains=True, counts_steps=True),
    "min_steps": TrainerArgument(trains=False, counts_steps=True),
    "overfit_batches": TrainerArgument(trains=False, counts_steps=True),
    "val_check_interval": TrainerArgument(trains=False, counts_steps=True),
    "reload_dataloaders_every_n_epochs": TrainerArgument(trains=False, counts_steps=True),
    "use_distributed_sampler": TrainerArgument(trains=False, counts_steps=True),
}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``--data-dir`` wins, then the ``DATA_DIR`` environment variable, then ``data/``."""
    return Path(data_dir or os.environ.get("DATA_DIR") or "data")


# Trainer arguments that are also first-class settings: ``--trainer.max_epochs`` is ``--max-epochs``.
TRAINER_SETTINGS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "max_epochs", "deterministic",
                    "detect_anomaly", "fast_dev_run", "log_every_n_steps")


def resolve_config(layers: list[tuple[Mapping[str, Any], str]], recipe: Recipe) -> RunConfig:
    """A ``RunConfig`` of ``recipe`` from layers of values, each overriding the ones before it and the recipe's
    defaults.

    A layer is ``(values, source)``: a config file's mapping (source ``--config FILE``), a sweep
    trial's, or the command line's flags (source ``""``). ``values["trainer"]`` holds Lightning
    ``Trainer`` arguments; those that are first-class settings are moved to them, and a layer
    that gives both differently is refused.
    """
    return resolve_config_and_given(layers, recipe)[0]


def _trainer_args_checked(values: dict[str, Any]) -> dict[str, Any]:
    """``--trainer.*`` values checked (``trainer_args.py``, loaded for a run given one)."""
    if not values:
        return {}
    from project.config.trainer_args import check_trainer_args

    return check_trainer_args(values)


def resolve_config_and_given(layers: list[tuple[Mapping[str, Any], str]],
                             recipe: Recipe) -> tuple[RunConfig, frozenset[str]]:
    """``resolve_config``, and the settings the layers name (a Trainer argument as ``trainer.KEY``): what a resume
    must not take from the run it continues."""
    known = settings_of(recipe)
    settings: dict[str, Any] = {name: spec.default for name, spec in known.items() if name in recipe.defaults or
                                name in recipe.options or name == "name"}
    passthrough: dict[str, Any] = {}
    given: set[str] = set()
    for values, source in layers:
        _check_recipe_key(values, source, recipe)
        layer, trainer = _checked_layer(values, source, known)
        given.update(layer)
        settings.update(layer)
        passthrough.update(trainer)
    passthrough = _trainer_args_checked(passthrough)
    options = {name: settings.pop(name) for name in recipe.options}
    config = RunConfig(**settings, options=options, trainer=passthrough)
    return config, frozenset([*given, *(f"trainer.{key}" for key in passthrough)])


def _check_recipe_key(values: Mapping[str, Any], source: str, recipe: Recipe) -> None:
    """A run's config.yaml names its recipe: read with another one installed, its options would be another
    model's."""
    named = values.get("recipe")
    if named is not None and named != recipe.package:
        raise UsageError(f"{source or 'recipe'}: made for recipe {shown(named)}, and the recipe here is "
                         f"{recipe.package}: run it with PROJECT_RECIPE={named}")


def _label(source: str, key: str, trainer: bool = False) -> str:
    if source:
        return f"{source}: {'trainer.' if trainer else ''}{key}"
    return f"--trainer.{key}" if trainer else f"--{key.replace('_', '-')}"


def _checked_layer(values: Mapping[str, Any], source: str,
                   known: Mapping[str, Setting]) -> tuple[dict[str, Any], dict[str, Any]]:
    checked: dict[str, Any] = {}
    trainer = values.get("trainer") or {}
    if not isinstance(trainer, Mapping):
        raise UsageError(f"{_label(source, 'trainer')}: expected a mapping of Trainer arguments")
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name in ("trainer", "recipe"):
            continue
        if name not in known:
            if not source:  # RunConfig.for_recipe's own arguments (the command line's are argparse's to refuse)
                raise UsageError(f"RunConfig.for_recipe: unknown setting {shown(key)} (settings are train.py's flags "
                                 f"by their Python names, e.g. max_epochs, and the recipe's options: "
                                 f"{', '.join(sorted(o for o in known if o not in ENGINE_SETTINGS)) or 'none'})")
            raise UsageError(f"{source}: unknown key {shown(key)} (keys are train.py flag names, e.g. max_epochs)")
        checked[name] = _check(known[name], value, _label(source, str(key)))
    passthrough: dict[str, Any] = {}
    for key, value in trainer.items():
        key = str(key)
        if key not in TRAINER_SETTINGS:
            passthrough[key] = value
            continue
        typed = _check(known[key], value, _label(source, key, trainer=True))
        if key in checked and checked[key] != typed:
            raise UsageError(f"{_label(source, key, trainer=True)} {value} and {_label(source, key)} "
                             f"{checked[key]} disagree; give one of them")
        checked[key] = typed
    return checked, passthrough


def _check(spec: Setting, value: Any, label: str) -> Any:
    try:
        return spec.check(value)
    except ValueError as err:
        raise UsageError(f"{label}: {err}") from None
