"""The run's schema: flags, config files and --trainer.* all land in one RunConfig, checked in one place."""

import subprocess
import sys

import pytest
import yaml

from helpers import HANG_S, ROOT, RUN_STARTED, one_line_error, parse_run_config, run_script, tiny_recipe
from project.config.cli import build_parser
from project.config.schema import RunConfig, resolve_config, settings_of
from project.config.trainer_args import check_trainer_args
from project.errors import UsageError


def refused(capsys, argv) -> str:
    """The one line ``parse_run_config`` prints before exiting with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        parse_run_config(argv)
    assert exit_info.value.code == 2
    return one_line_error(capsys.readouterr().err)


def test_help_is_instant_and_imports_no_torch():
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['train.py', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(ROOT / 'scripts' / 'train.py')!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'torchvision') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert "--accelerator" in done.stdout and "--precision" in done.stdout and "--trainer.KEY" in done.stdout
    assert "HEAVY []" in done.stdout
    words = " ".join(done.stdout.split())
    assert words.count("(default: $DATA_DIR, else data/)") == 1  # said once, not twice
    assert "(default: None)" not in words


def test_every_setting_is_a_flag_with_its_default():
    parser = build_parser(tiny_recipe())
    flags = {option for action in parser._actions for option in action.option_strings}  # noqa: SLF001
    for name in settings_of(tiny_recipe()):
        assert "--" + name.replace("_", "-") in flags
    assert "--hidden" in flags  # the recipe's option
    assert parse_run_config([]) == RunConfig.for_recipe(tiny_recipe())


def test_command_line_overrides_the_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_epochs: 3\nbatch-size: 128\nhidden: [256, 128]\ndeterministic: true\nfast_dev_run: true\n")
    args = parse_run_config(["--config", str(config), "--max-epochs", "4", "--no-fast-dev-run"])
    assert (args.max_epochs, args.batch_size, args.options["hidden"], args.deterministic) == (4, 128, [256, 128], True)
    assert args.fast_dev_run is False
    assert parse_run_config(["--config", str(config)]).fast_dev_run is True  # allowed in config files


@pytest.mark.parametrize(("text", "message"), [
    ("bogus: 1\n", "unknown key 'bogus'"),
    ("batch_size: -3\n", "batch_size: must be a positive integer"),
    ("deterministic: maybe\n", "deterministic: must be true or false"),
    ("- just\n- a list\n", "expected a mapping"),
    ("trainer: 3\n", "trainer: expected a mapping"),
    ("max_epochs: [\n", "not valid YAML"),
])
def test_bad_config_files_are_refused_naming_the_file(tmp_path, capsys, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    line = refused(capsys, ["--config", str(config)])
    assert message in line and str(config) in line


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    assert "cannot read it" in refused(capsys, ["--config", str(tmp_path / "nope.yaml")])


def test_a_preset_is_named_by_the_recipe_and_the_command_line_overrides_it(capsys):
    args = parse_run_config(["--config", "quick", "--max-epochs", "3"])
    assert (args.max_epochs, args.batch_size, args.options["hidden"]) == (3, 32, [16])
    line = refused(capsys, ["--config", "quik"])
    assert line.endswith("--config quik: no such file, and not one of the recipe's presets (quick)")


def test_the_recipes_defaults_replace_the_engines():
    recipe_defaults = RunConfig.for_recipe(tiny_recipe())
    engine_defaults = RunConfig()
    assert (recipe_defaults.batch_size, recipe_defaults.optimizer, recipe_defaults.lr) == (256, "sgd", 0.2)
    assert (recipe_defaults.name, recipe_defaults.options) == ("tiny", {"hidden": [128]})
    assert (engine_defaults.batch_size, engine_defaults.optimizer, engine_defaults.lr) == (64, "adamw", 1e-3)
    help_text = build_parser(tiny_recipe()).format_help()
    assert "(default: 256, the recipe's)" in help_text and "(default: 1000)" in help_text
    assert recipe_defaults.to_mapping()["batch_size"] == 256  # config.yaml records them
    assert recipe_defaults.to_mapping()["hidden"] == [128]  # the options beside the engine's settings


INVALID_FLAGS = [
    (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
    (["--max-epochs", "-1"], "--max-epochs: must be a positive integer"),
    (["--lr", "0"], "--lr: must be a positive number"),
    (["--lr", "-1"], "argument --lr: must be a positive number, got -1"),
    (["--hidden", "128,0"], "--hidden: must be a positive integer"),
    (["--optimizer", "rmsprop"], "invalid choice: 'rmsprop'"),
    (["--precision", "17"], "argument --precision: invalid choice: '17'"),
    (["--devices", "0"], "device count must be >= 1"),
    (["--devices", "1,1"], "device indices must be distinct"),
    (["--gpu-memory-fraction", "1.5"], "must be in (0, 1]"),
    (["--fast-dev-run", "--resume", "last"], "--fast-dev-run cannot be combined with --resume"),
    (["--seed", "x"], "argument --seed: not a valid int: 'x'"),
]


@pytest.mark.parametrize(("flags", "message"), INVALID_FLAGS)
def test_bad_flags_get_one_line(capsys, flags, message):
    assert message in refused(capsys, flags)


def test_a_bad_flag_exits_2_with_one_line_from_the_script():
    done = run_script("train.py", "--batch-size", "0")
    assert done.returncode == 2
    assert one_line_error(done.stderr) == "train.py: error: argument --batch-size: must be a positive integer, got 0"


# ---------------------------------------------------------------- --trainer.* pass-through

def test_trainer_arguments_pass_through_typed_from_the_signature():
    config = parse_run_config(["--trainer.accumulate_grad_batches", "4", "--trainer.gradient_clip_val=0.5",
                               "--trainer.val_check_interval", "0.5", "--trainer.limit_train_batches", "0.1",
                               "--trainer.profiler", "simple", "--trainer.benchmark", "true"])
    assert config.trainer == {"accumulate_grad_batches": 4, "gradient_clip_val": 0.5, "val_check_interval": 0.5,
                              "limit_train_batches": 0.1, "profiler": "simple", "benchmark": True}


def test_trainer_keys_with_a_first_class_flag_map_to_it(capsys):
    config = parse_run_config(["--trainer.max_epochs", "3", "--trainer.precision", "bf16-mixed"])
    assert (config.max_epochs, config.precision, config.trainer) == (3, "bf16-mixed", {})
    assert parse_run_config(["--trainer.max_epochs", "3", "--max-epochs", "3"]).max_epochs == 3  # agreeing is fine
    line = refused(capsys, ["--trainer.max_epochs", "3", "--max-epochs", "4"])
    assert "--trainer.max_epochs 3 and --max-epochs 4 disagree" in line


@pytest.mark.parametrize(("flags", "message"), [
    (["--trainer.no_such_key", "1"], "--trainer.no_such_key: not an argument of lightning.Trainer"),
    (["--trainer.max_epochs", "abc"], "--trainer.max_epochs: not a valid int: 'abc'"),
    (["--trainer.gradient_clip_val", "big"], "--trainer.gradient_clip_val: expected int, float, null, got 'big'"),
    (["--trainer.accumulate_grad_batches", "0.5"], "--trainer.accumulate_grad_batches: expected int, got 0.5"),
    (["--trainer.accumulate_grad_bathces", "2"], "(did you mean accumulate_grad_batches?)"),
    (["--trainer.logger", "false"], "--trainer.logger: set by the template; use --logger"),
    (["--trainer.callbacks", "[]"], "--trainer.callbacks: set by the template"),
    (["--trainer.profiler"], "--trainer.profiler: needs a value"),
])
def test_bad_trainer_arguments_get_one_line(capsys, flags, message):
    assert message in refused(capsys, flags)


def test_trainer_mapping_in_a_config_file_and_saved_config_round_trip(tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("trainer:\n  accumulate_grad_batches: 2\n  max_epochs: 2\n")
    config = parse_run_config(["--config", str(config_file), "--trainer.gradient_clip_val", "1"])
    assert config.max_epochs == 2 and config.trainer == {"accumulate_grad_batches": 2, "gradient_clip_val": 1}
    saved = tmp_path / "saved.yaml"
    saved.write_text(yaml.safe_dump(config.to_mapping()))
    assert parse_run_config(["--config", str(saved)]) == config


def test_trainer_argument_checks_follow_the_declared_types():
    assert check_trainer_args({"devices": [0, 1], "max_time": "00:01:00:00", "limit_val_batches": None})
    with pytest.raises(UsageError, match=r"--trainer.max_time: expected str, a mapping, null, got 5"):
        check_trainer_args({"max_time": 5})
    with pytest.raises(UsageError, match="expected int"):
        check_trainer_args({"accumulate_grad_batches": True})  # a bool is not a count


def test_resolve_config_layers_override_in_order():
    config = resolve_config([({"lr": 0.1, "seed": 3}, "fixed"), ({"lr": 0.3}, "params")], tiny_recipe())
    assert (config.lr, config.seed) == (0.3, 3)
    saved = config.to_mapping()
    assert "resume" not in saved and "export" not in saved and "debug" not in saved and saved["lr"] == 0.3


@pytest.mark.parametrize(("flag", "message"), [
    (("--trainer.val_check_interval", "1000"), "`val_check_interval` (1000) must be less than or equal to the number "
                                               "of the training batches"),
    (("--trainer.check_val_every_n_epoch", "0"), "--trainer.check_val_every_n_epoch: must be 1 or more, got 0"),
])
def test_lightnings_own_setting_errors_are_one_line_exit_2(shared_tiny_data, tmp_path, flag, message):
    """Settings Lightning checks (or trips over) only once the fit starts: one line, not its traceback."""
    done = run_script("train.py", "--data-dir", str(shared_tiny_data), "--logdir", str(tmp_path), "--val-size", "40",
                      "--steps-per-call", "1", *flag)
    assert done.returncode == 2
    assert message in one_line_error(done.stderr, after=RUN_STARTED)
