"""Changing the engine where ``docs/adapt.md`` says to: each change made in a copy of the template (or through its
registry) takes effect, and one made half is refused in one line before anything trains."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from mutants import copy_template

from helpers import TINY, make_tiny_data, one_line_error, run_script
from project.errors import UsageError
from project.training import classifier

RMSPROP_LINE = '    "rmsprop": lambda parameters, s: torch.optim.RMSprop(parameters, lr=s.lr, momentum=s.momentum),\n'
ADAMW_LINE = '    "adamw": _adam(torch.optim.AdamW),\n'
NAMES = 'OPTIMIZERS = ("sgd", "adam", "adamw")'


def test_an_unknown_optimizer_or_scheduler_is_one_line_naming_the_known_ones():
    network = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError, match=r"^--optimizer rmsprop: unknown; choose from sgd, adam, adamw$"):
        classifier.optimizer_and_schedule(network.parameters(), "rmsprop", 0.1, 0.9, 0.0, "none", None, 10,
                                          torch.device("cpu"))
    with pytest.raises(UsageError, match=r"^--scheduler step: unknown; choose from none, onecycle, cosine$"):
        classifier.optimizer_and_schedule(network.parameters(), "sgd", 0.1, 0.9, 0.0, "step", None, 10,
                                          torch.device("cpu"))


def test_the_registries_name_what_the_command_line_offers():
    from project import LOGGERS, OPTIMIZERS, SCHEDULERS
    from project.config.validators import registries_problem
    from project.training.build import LOGGER_BUILDERS

    assert tuple(classifier.OPTIMIZER_BUILDERS) == OPTIMIZERS and tuple(classifier.SCHEDULE_BUILDERS) == SCHEDULERS
    assert tuple(LOGGER_BUILDERS) == LOGGERS
    where = "project.training.classifier"
    assert registries_problem(("sgd", "lion"), {"sgd": None}, "OPTIMIZERS", where) == (
        "'lion' is in project.OPTIMIZERS but has no builder in project/training/classifier.py")
    assert registries_problem(("sgd",), {"sgd": None, "lion": None}, "OPTIMIZERS", where) == (
        "'lion' has a builder in project/training/classifier.py but is not in project.OPTIMIZERS "
        "(project/__init__.py)")
    assert registries_problem(("sgd",), {"sgd": None}, "OPTIMIZERS", where) is None


def test_an_unknown_logger_is_one_line_naming_the_known_ones():
    from project.config.schema import RunConfig
    from project.config.validators import registered
    from project.training.build import LOGGER_BUILDERS, build_loggers

    with pytest.raises(UsageError, match=r"^--logger neptune: unknown; choose from tensorboard, csv, wandb, mlflow$"):
        registered(LOGGER_BUILDERS, "neptune", "--logger")
    with pytest.raises(UsageError, match=r"^--logger: choose from tensorboard, csv, wandb, mlflow \(comma-separated\), "
                                         r"got 'csv,neptune'$"):
        build_loggers(RunConfig(logger="csv,neptune"), None)


@pytest.mark.parametrize(("name", "kind", "state"), [("sgd", torch.optim.SGD, "momentum_buffer"),
                                                     ("adam", torch.optim.Adam, "exp_avg_sq"),
                                                     ("adamw", torch.optim.AdamW, "exp_avg_sq")])
def test_each_registered_optimizer_builds_itself(name, kind, state):
    network = torch.nn.Linear(2, 2)
    optimizer, schedule = classifier.optimizer_and_schedule(network.parameters(), name, 0.1, 0.9, 0.0, "onecycle",
                                                            None, 10, torch.device("cpu"))
    assert type(optimizer) is kind and isinstance(schedule, torch.optim.lr_scheduler.OneCycleLR)
    network(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert state in optimizer.state[network.weight]


@dataclass(frozen=True)
class Registration:
    """A name added to one of ``project/__init__.py``'s tuples, and its builder to the registry in ``registry``."""

    flag: str
    name: str
    names: str  # the tuple's line, as it is
    registry: str  # the registry's file, from the template's root
    anchor: str  # a line of the registry, found once: the builder goes after it
    builder: str

    def trained_in_a_copy(self, tmp_path: Path) -> Path:
        """Half of it (the name alone) is refused in one line before anything trains, naming the file to edit; the
        whole trains. The run's logs."""
        template = copy_template(tmp_path / "template")
        names, builders = template / "project" / "__init__.py", template / self.registry
        names.write_text(names.read_text().replace(self.names, self.names.replace(")", f', "{self.name}")')))
        plain = builders.read_text()
        assert plain.count(self.anchor) == 1
        data, logs = make_tiny_data(tmp_path / "data"), tmp_path / "logs"
        arguments = (self.flag, self.name, "--max-epochs", "1", "--data-dir", str(data), "--logdir", str(logs), *TINY)
        half = run_script("train.py", *arguments, root=template)
        assert half.returncode == 2
        tuple_name = self.names.split(" = ")[0]
        assert one_line_error(half.stderr).endswith(f"'{self.name}' is in project.{tuple_name} but has no builder in "
                                                    f"{self.registry}")
        assert not logs.exists()
        builders.write_text(plain.replace(self.anchor, self.anchor + self.builder))
        done = run_script("train.py", *arguments, root=template)
        assert done.returncode == 0, done.stderr
        return logs


RMSPROP = Registration("--optimizer", "rmsprop", NAMES, "project/training/classifier.py", ADAMW_LINE, RMSPROP_LINE)
PLAIN_CSV = Registration(
    "--logger", "plain-csv", 'LOGGERS = ("tensorboard", "csv", "wandb", "mlflow")', "project/training/build.py",
    '    "csv": lambda config, version: AppendingCSVLogger(config.logdir, name=config.name, version=version),\n',
    '    "plain-csv": lambda config, version: CSVLogger(config.logdir, name=config.name, version=version),\n')


@pytest.mark.slow
def test_a_new_optimizer_is_its_builder_and_its_name_and_half_of_it_is_one_line(tmp_path):
    logs = RMSPROP.trained_in_a_copy(tmp_path)
    last = next(logs.glob("*/version_0/checkpoints/last.ckpt"))
    state = torch.load(last, weights_only=True)["optimizer_states"][0]["state"]
    assert all("square_avg" in per_parameter for per_parameter in state.values())  # RMSprop's, no other's


@pytest.mark.slow
def test_a_new_logger_is_its_builder_and_its_name_and_half_of_it_is_one_line(tmp_path):
    run = PLAIN_CSV.trained_in_a_copy(tmp_path) / "tiny" / "version_0"
    assert "val/acc" in (run / "metrics.csv").read_text().splitlines()[0]  # Lightning's own CSVLogger wrote it
    assert not list(run.glob("events.out.tfevents.*"))  # and no TensorBoard logger was made


@pytest.mark.slow
def test_the_checkpoint_files_are_renamed_in_one_place(tmp_path):
    """``LAST`` and ``BEST`` in ``project/reliability/run_folder.py``: the run writes them, ``--resume last`` and
    ``runs.py`` find them, and no file of the old names is written."""
    template = copy_template(tmp_path / "template")
    names = template / "project" / "reliability" / "run_folder.py"
    text = names.read_text()
    assert text.count('LAST = "last"') == 1 and text.count('BEST = "best"') == 1
    names.write_text(text.replace('LAST = "last"', 'LAST = "newest"').replace('BEST = "best"', 'BEST = "top"'))
    data, logs = make_tiny_data(tmp_path / "data"), tmp_path / "logs"
    common = ("--data-dir", str(data), "--logdir", str(logs), *TINY)
    first = run_script("train.py", "--max-epochs", "1", *common, root=template)
    assert first.returncode == 0, first.stderr
    saved = sorted(p.name for p in logs.glob("*/version_0/checkpoints/*.ckpt"))
    assert saved[0] == "newest.ckpt" and all(name.startswith("top-epoch01-acc") for name in saved[1:]), saved
    listed = run_script("runs.py", "--logdir", str(logs), root=template)
    assert listed.returncode == 0 and "top-epoch01-acc" in listed.stdout, listed.stdout + listed.stderr
    # --resume last finds newest.ckpt (here refused in one line, naming it: a resume keeps the run's epochs).
    resumed = run_script("train.py", "--max-epochs", "2", "--resume", "last", *common, root=template)
    assert resumed.returncode == 1  # a refusal the run's own checks make
    assert one_line_error(resumed.stderr).endswith("--init-from " + str(next(logs.glob("*/version_0/checkpoints/"
                                                                                        "newest.ckpt"))))
    assert not list(logs.glob("**/last.ckpt")) and not list(logs.glob("**/best-*.ckpt"))


IN_MEMORY_AUGMENT = ("MNISTDataModule defines augment, but it holds its training set in memory (load_tensors), where "
                     "nothing augments: read it per sample (load_samples alone) to augment it, or remove augment")


def test_an_augment_on_mnist_held_in_memory_is_refused_by_the_api_and_the_checks(tmp_path, monkeypatch):
    """MNIST's recipe holds its images in memory: an ``augment`` there would never run, so it is refused, not
    reported as checked."""
    from project import api
    from project.config.schema import RunConfig
    from project.contract import RecipeError, load_recipe
    from project.recipe.data import MNISTDataModule
    from project.training.recipe_checks import check_recipe

    recipe = load_recipe("project.recipe")
    config = RunConfig.for_recipe(recipe, data_dir=str(recipe.write_example_data(tmp_path / "data")),
                                  logdir=str(tmp_path / "logs"), max_epochs=1)
    monkeypatch.setattr(MNISTDataModule, "augment", lambda self, inputs, generator: inputs.flip(-1), raising=False)
    with pytest.raises(RecipeError) as refused:
        api.train(config, recipe)
    assert str(refused.value) == IN_MEMORY_AUGMENT
    assert not (tmp_path / "logs").exists()
    assert [f.line() for f in check_recipe(config, recipe)] == [f"FAIL  datamodule: {IN_MEMORY_AUGMENT}"]


@pytest.mark.slow
def test_an_augment_added_to_mnists_data_py_is_one_line_from_train_py(tmp_path):
    template = copy_template(tmp_path / "template")
    data_py = template / "project" / "recipe" / "data.py"
    anchor = "    def read_image(self, path"
    assert data_py.read_text().count(anchor) == 1
    data_py.write_text(data_py.read_text().replace(anchor, "    def augment(self, inputs, generator):\n"
                                                          "        return inputs.flip(-1)\n\n" + anchor))
    logs = tmp_path / "logs"
    done = run_script("train.py", "--fast-dev-run", "--logdir", str(logs), root=template,
                      env={"PROJECT_RECIPE": "project.recipe"})
    assert done.returncode == 2 and one_line_error(done.stderr) == f"train.py: error: {IN_MEMORY_AUGMENT}"
    assert not logs.exists()


SEED_LINE = ('    seed: int = setting(0, seed_value, "seeds the split, the data order and the weights", "recipe", '
             'trains=True)\n')
KNOB_LINE = '    knob: float = setting(0.0, non_negative_float, "a new training setting", "recipe", trains=True)\n'


@pytest.mark.slow
def test_a_new_training_setting_declared_in_schema_alone_is_kept_by_a_resume(tmp_path):
    """``trains=True`` where the setting is defined: ``--resume last`` adopts the run's value and refuses another,
    with no list elsewhere to extend."""
    template = copy_template(tmp_path / "template")
    schema = template / "project" / "config" / "schema.py"
    assert schema.read_text().count(SEED_LINE) == 1
    schema.write_text(schema.read_text().replace(SEED_LINE, SEED_LINE + KNOB_LINE))
    data, logs = make_tiny_data(tmp_path / "data"), tmp_path / "logs"
    common = ("--data-dir", str(data), "--logdir", str(logs), "--scheduler", "none", *TINY)
    first = run_script("train.py", "--max-epochs", "1", "--knob", "0.5", *common, root=template)
    assert first.returncode == 0, first.stderr
    changed = run_script("train.py", "--max-epochs", "2", "--resume", "last", "--knob", "0.7", *common, root=template)
    assert changed.returncode == 1
    assert "--knob 0.7: the checkpoint's run trained with --knob 0.5" in one_line_error(changed.stderr)
    adopted = run_script("train.py", "--max-epochs", "2", "--resume", "last", *common, root=template)
    assert adopted.returncode == 0, adopted.stderr
    assert "with its run's settings: --knob 0.5" in adopted.stderr


MARKER = """\
    class Marker(L.Callback):
        def on_train_end(self, trainer, pl_module):
            Path(trainer.log_dir, "marker.txt").write_text(str(trainer.global_step))

    callbacks.append(Marker())
"""


@pytest.mark.slow
def test_a_new_metric_and_a_new_callback_take_effect_where_the_table_says(tmp_path):
    """A metric object added to ``ClassifierModule`` and logged in the step reaches TensorBoard and ``metrics.csv``;
    a callback added in ``build_callbacks`` runs in every run (one that notes the run's last step in its folder)."""
    from helpers import event_accumulator

    template = copy_template(tmp_path / "template")
    module = template / "project" / "training" / "classifier.py"
    made, logged = "        self.val_acc_best = MaxMetric()\n", '        self.log(f"{stage}/acc", acc, prog_bar=True)\n'
    text = module.read_text()
    assert text.count(made) == 1 and text.count(logged) == 1
    module.write_text(text.replace(made, made + "        from torchmetrics.classification import MulticlassAccuracy\n"
                                   "        self.val_top2 = MulticlassAccuracy(num_classes, top_k=2)\n").replace(
        logged, logged + '        if stage == "val":\n            self.val_top2.update(outputs, y)\n'
                         '            self.log("val/top2", self.val_top2)\n'))
    build = template / "project" / "training" / "build.py"
    anchor = "    if config.fast_dev_run:\n        return callbacks\n"
    assert build.read_text().count(anchor) == 1
    build.write_text(build.read_text().replace(anchor, MARKER + anchor))
    data, logs = make_tiny_data(tmp_path / "data"), tmp_path / "logs"
    done = run_script("train.py", "--max-epochs", "1", "--logger", "tensorboard,csv", "--data-dir", str(data),
                      "--logdir", str(logs), *TINY, root=template)
    assert done.returncode == 0, done.stderr
    run = logs / "tiny" / "version_0"
    columns = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "val/top2" in columns, columns
    assert [e.step for e in event_accumulator(run).Scalars("val/top2")]  # and in TensorBoard
    steps = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert (run / "marker.txt").read_text() == str(steps) and steps > 0  # the callback ran at the run's end
