"""Every script's command line, parsed in this process: each tool's settings and their defaults, its one-line
refusals, ``train.py --help`` naming each default and where it comes from, ``--config``'s presets and
``--trainer.*``'s tokens. (The scripts themselves run these in ``tests/test_train_script.py`` and beside it.)"""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from helpers import parse_run_command_of, tiny_recipe
from project.config import cli, tool_args
from project.config.validators import flag, positive_int
from project.contract import Option, load_recipe
from project.errors import UsageError


def parsed(monkeypatch, parse, *argv: str) -> dict:
    monkeypatch.setattr(sys, "argv", ["script.py", *argv])
    return vars(parse())


def test_each_tools_settings_and_defaults(monkeypatch):
    recipe = tiny_recipe()
    common = {"debug": False}
    model = {"ckpt": None, "weights": None, "logdir": "lightning_logs", "name": "tiny"}
    assert parsed(monkeypatch, lambda: tool_args.parse_evaluate_args(recipe, None)) == {
        **common, **model, "data_dir": None, "images": None, "json": False, "plot": None}
    assert parsed(monkeypatch, lambda: tool_args.parse_predict_args(recipe, None), "a.png", "dir") == {
        **common, "inputs": ["a.png", "dir"], **model, "topk": 1, "json": False}
    assert parsed(monkeypatch, lambda: tool_args.parse_check_recipe_args(None)) == {
        **common, "data_dir": None, "max_epochs": None, "no_learn": False}
    assert parsed(monkeypatch, lambda: tool_args.parse_new_recipe_args(None), "mine", "--images", "pics") == {
        **common, "name": "mine", "images": "pics", "from_package": None, "out": "."}
    assert parsed(monkeypatch, lambda: tool_args.parse_new_recipe_args(None), "mine", "--from", "tests.second_recipe")[
        "from_package"] == "tests.second_recipe"
    assert parsed(monkeypatch, lambda: tool_args.parse_sweep_args(recipe, None)) == {
        **common, "space": str(recipe.folder / "sweep.yaml"), "n_trials": 20,
        "storage": "lightning_logs/sweeps/" + tool_args.SWEEP_STORAGE, "workers": "auto", "heartbeat": 60,
        "worker": False,
        "study_name": "tiny-sweep", "pruner": "median", "sampler": "tpe", "sampler_seed": None, "data_dir": None,
        "logdir": "lightning_logs", "val_size": None, "accelerator": None}  # None: the space's fixed, else auto
    assert parsed(monkeypatch, lambda: tool_args.parse_sweep_args(recipe, None), "--logdir", "runs", "--workers", "2",
                  "--val-size", "0.25")["storage"] == "runs/sweeps/" + tool_args.SWEEP_STORAGE
    assert parsed(monkeypatch, lambda: tool_args.parse_sweep_args(recipe, None), "--storage", "postgresql://h/db")[
        "storage"] == "postgresql://h/db"
    assert parsed(monkeypatch, lambda: tool_args.parse_benchmark_args(recipe, None)) == {
        **common, "batch_size": 64, "epochs": 3, "accelerator": "auto", "precision": "32", "data_dir": None,
        "example_data": None, "limit": None, "val_size": None, "num_workers": None, "only": "all",
        "time_to_accuracy": False, "out": "benchmark-results", "repeat": 1}
    assert parsed(monkeypatch, lambda: tool_args.parse_runs_args(recipe, None)) == {
        **common, "logdir": "lightning_logs", "name": "tiny"}
    assert parsed(monkeypatch, lambda: tool_args.parse_check_gpu_args(None)) == {
        **common, "json": False, "bench": False}
    assert parsed(monkeypatch, lambda: tool_args.parse_engine_size_args(None), "--debug") == {"debug": True}
    assert parsed(monkeypatch, lambda: tool_args.parse_plot_scalars_args(None, ["train/loss", "val/acc"]),
                  "runs/v0") == {
        **common, "run": "runs/v0", "out": "scalars.png", "tags": "train/loss,val/acc"}


def test_each_tools_options_are_read_as_their_types(monkeypatch, tmp_path):
    recipe = tiny_recipe()
    plot, out = str(tmp_path / "m.png"), str(tmp_path / "out")
    assert parsed(monkeypatch, lambda: tool_args.parse_evaluate_args(recipe, None), "--plot", plot, "--name", "mine",
                  "--ckpt", "last", "--json", "--debug", "--data-dir", "d", "--logdir", "l", "--images", "held") == {
        "debug": True, "ckpt": "last", "weights": None, "logdir": "l", "name": "mine", "data_dir": "d", "json": True,
        "plot": plot, "images": "held"}
    assert parsed(monkeypatch, lambda: tool_args.parse_predict_args(recipe, None), "a.png", "--topk", "3", "--weights",
                  "m.pth", "--json") == {"debug": False, "inputs": ["a.png"], "ckpt": None, "weights": "m.pth",
                                         "logdir": "lightning_logs", "name": "tiny", "topk": 3, "json": True}
    assert parsed(monkeypatch, lambda: tool_args.parse_check_recipe_args(None), "--max-epochs", "3", "--no-learn",
                  "--data-dir", "d") == {"debug": False, "data_dir": "d", "max_epochs": 3, "no_learn": True}
    assert parsed(monkeypatch, lambda: tool_args.parse_new_recipe_args(None), "mine", "--images", "pics", "--out",
                  "o") == {
        "debug": False, "name": "mine", "images": "pics", "from_package": None, "out": "o"}
    assert parsed(monkeypatch, lambda: tool_args.parse_sweep_args(recipe, None), "--n-trials", "5", "--workers", "2",
                  "--heartbeat", "30", "--sampler-seed", "7", "--val-size", "0.25", "--study-name", "s", "--sampler",
                  "random", "--pruner", "halving", "--accelerator", "cpu", "--space", "f.yaml", "--data-dir", "d",
                  "--worker") == {
        "debug": False, "space": "f.yaml", "n_trials": 5, "storage": "lightning_logs/sweeps/" + tool_args.SWEEP_STORAGE,
        "workers": 2, "heartbeat": 30, "worker": True, "study_name": "s", "pruner": "halving", "sampler": "random",
        "sampler_seed": 7, "data_dir": "d", "logdir": "lightning_logs", "val_size": 0.25, "accelerator": "cpu"}
    assert parsed(monkeypatch, lambda: tool_args.parse_benchmark_args(recipe, None), "--batch-size", "32", "--epochs",
                  "2",
                  "--example-data", "100", "--limit", "50", "--val-size", "10", "--num-workers", "0", "--out", out,
                  "--precision", "bf16-mixed", "--accelerator", "cpu", "--only", "hand", "--time-to-accuracy",
                  "--repeat", "5") == {
        "debug": False, "batch_size": 32, "epochs": 2, "accelerator": "cpu", "precision": "bf16-mixed",
        "data_dir": None, "example_data": 100, "limit": 50, "val_size": 10, "num_workers": 0, "only": "hand",
        "time_to_accuracy": True, "out": out, "repeat": 5}
    assert parsed(monkeypatch, lambda: tool_args.parse_runs_args(recipe, None), "--logdir", "l", "--name", "mine") == {
        "debug": False, "logdir": "l", "name": "mine"}
    assert parsed(monkeypatch, lambda: tool_args.parse_check_gpu_args(None), "--json", "--bench") == {
        "debug": False, "json": True, "bench": True}
    assert parsed(monkeypatch, lambda: tool_args.parse_plot_scalars_args(None, ["a"]), "r", "--out", plot, "--tags",
                  "x,y") == {"debug": False, "run": "r", "out": plot, "tags": "x,y"}


@pytest.mark.parametrize(("parse", "argv", "error"), [
    (lambda: tool_args.parse_predict_args(tiny_recipe(), None), [],
     "predict.py: error: the following arguments are required: IMAGE|DIR"),
    (lambda: tool_args.parse_predict_args(tiny_recipe(), None), ["a.png", "--ckpt", "best", "--weights", "m.pth"],
     "predict.py: error: argument --weights: not allowed with argument --ckpt"),
    (lambda: tool_args.parse_predict_args(tiny_recipe(), None), ["a.png", "--topk", "0"],
     "predict.py: error: argument --topk: must be a positive integer, got 0"),
    (lambda: tool_args.parse_evaluate_args(tiny_recipe(), None), ["--name", "../up"],
     "evaluate.py: error: argument --name: must be one plain folder name, got '../up'"),
    (lambda: tool_args.parse_new_recipe_args(None), ["mine"],
     "new_recipe.py: error: one of the arguments --images --from is required"),
    (lambda: tool_args.parse_sweep_args(tiny_recipe(), None), ["--pruner", "best"],
     "sweep.py: error: argument --pruner: invalid choice: 'best' (choose from 'median', 'halving', 'none')"),
    (lambda: tool_args.parse_sweep_args(tiny_recipe(), None), ["--workers", "0"],
     "sweep.py: error: argument --workers: must be a positive integer, got 0"),
    (lambda: tool_args.parse_benchmark_args(tiny_recipe(), None), ["--precision", "8"],
     "benchmark.py: error: argument --precision: invalid choice: '8' (choose from "
     + ", ".join(tool_args.PRECISIONS) + ")"),
    (lambda: tool_args.parse_benchmark_args(tiny_recipe(), None), ["--data-dir", "d", "--example-data", "64"],
     "benchmark.py: error: argument --example-data: not allowed with argument --data-dir"),
    (lambda: tool_args.parse_check_recipe_args(None), ["--max-epochs", "0"],
     "check_recipe.py: error: argument --max-epochs: must be a positive integer, got 0"),
    (lambda: tool_args.parse_plot_scalars_args(None, ["train/loss"]), ["run", "--out", "s.txt"],
     "plot_scalars.py: error: argument --out: 's.txt': name a .png, .pdf, .svg, .jpg, .jpeg file"),
    (lambda: tool_args.parse_evaluate_args(tiny_recipe(), None), ["--plot", "m.txt"],
     "evaluate.py: error: argument --plot: 'm.txt': name a .png, .pdf, .svg, .jpg, .jpeg file"),
    (lambda: tool_args.parse_new_recipe_args(None), ["../mine", "--images", "pics"],
     "new_recipe.py: error: argument name: must be one plain folder name, got '../mine'"),
    (lambda: tool_args.parse_runs_args(tiny_recipe(), None), ["--name", "a/b"],
     "runs.py: error: argument --name: must be one plain folder name, got 'a/b'"),
    (lambda: tool_args.parse_sweep_args(tiny_recipe(), None), ["--study-name", ".."],
     "sweep.py: error: argument --study-name: must be one plain folder name, got '..'"),
    (lambda: tool_args.parse_benchmark_args(tiny_recipe(), None), ["--out", "/dev/null"],
     "benchmark.py: error: argument --out: '/dev/null': is a file, not a folder"),
    (lambda: tool_args.parse_benchmark_args(tiny_recipe(), None), ["--repeat", "0"],
     "benchmark.py: error: argument --repeat: must be a positive integer, got 0"),
    (lambda: tool_args.parse_check_gpu_args(None), ["--all"], "check_gpu.py: error: unrecognized arguments: --all"),
    (lambda: tool_args.parse_engine_size_args(None), ["x"], "engine_size.py: error: unrecognized arguments: x"),
], ids=["predict-no-input", "predict-two-sources", "predict-topk", "evaluate-name", "new-recipe-source",
        "sweep-pruner", "sweep-workers", "benchmark-precision", "benchmark-two-datasets", "check-recipe-epochs",
        "plot-scalars-out", "evaluate-plot", "new-recipe-name", "runs-name", "sweep-study-name", "benchmark-out",
        "benchmark-repeat",
        "check-gpu-flag", "engine-size-argument"])
def test_a_tools_bad_command_line_is_one_line_and_exit_status_2(monkeypatch, capsys, parse, argv, error):
    monkeypatch.setattr(sys, "argv", ["script.py", *argv])
    with pytest.raises(SystemExit) as ended:
        parse()
    assert ended.value.code == 2 and capsys.readouterr().err == error + "\n"


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # each option's help on its own line


def help_line(help_text: str, flag_and_metavar: str) -> str:
    """An option's entry in ``--help``: its line, and its help where argparse moved it to the lines below."""
    lines = help_text.splitlines()
    (first,) = [i for i, line in enumerate(lines) if re.match(rf"  {re.escape(flag_and_metavar)}(\s|$)", line)]
    entry = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("    "):
            break
        entry.append(line)
    return re.sub(r"\s+", " ", " ".join(entry).strip())


def test_train_help_says_each_default_and_whose_it_is(wide):
    text = cli.build_parser(tiny_recipe()).format_help()
    assert text.startswith("usage: train.py [-h] [--version] ")
    assert "\nTrain a small MLP on tiny made-up digits, then test the best checkpoint.\n" in text
    assert text.endswith(cli.EPILOG)
    assert help_line(text, "--max-epochs MAX_EPOCHS") == "--max-epochs MAX_EPOCHS (default: 6, the recipe's)"
    assert help_line(text, "--eval-batch-size EVAL_BATCH_SIZE").endswith("(default: 1000)")
    assert help_line(text, "--hidden HIDDEN") == "--hidden HIDDEN hidden widths, e.g. 128 or 256,128 (default: 128)"
    assert help_line(text, "--val-size N|SHARE").endswith("(default: the recipe's)")
    assert help_line(text, "--config FILE.yaml|PRESET") == (
        "--config FILE.yaml|PRESET read settings from a YAML file (keys: flag names), or one of the recipe's presets "
        "(quick); the command line overrides it")
    assert help_line(text, "--fast-dev-run, --no-fast-dev-run").endswith("no logs or files")  # off: no default said
    assert help_line(text, "--compile [MODE]").startswith("--compile [MODE] ")
    for group in cli.GROUPS:
        assert f"\n{group}:\n" in text
    mnist = cli.build_parser(load_recipe("project.recipe")).format_help()
    assert "presets (article, fast, gpu-ddp);" in help_line(mnist, "--config FILE.yaml|PRESET")
    shapes = cli.build_parser(load_recipe("tests.disk_recipe")).format_help()
    assert help_line(shapes, "--channels CHANNELS").endswith("(default: 8,16)")  # a list as the flag takes it
    no_presets = dataclasses.replace(tiny_recipe(), package="tests.tiny_recipe.configs")
    assert "presets (none);" in help_line(cli.build_parser(no_presets).format_help(), "--config FILE.yaml|PRESET")


def test_compile_alone_is_its_default_mode_and_a_mode_is_taken_as_given():
    assert parse_run_command_of(tiny_recipe(), ["--compile"]).compile == "default"
    assert parse_run_command_of(tiny_recipe(), ["--compile", "max-autotune"]).compile == "max-autotune"
    assert parse_run_command_of(tiny_recipe(), []).compile is None


def test_version_is_the_projects(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser(tiny_recipe()).parse_args(["--version"])
    assert capsys.readouterr().out == f"train.py {cli.__version__}\n"


def test_a_recipe_option_checked_by_flag_is_an_on_off_switch():
    recipe = dataclasses.replace(tiny_recipe(), options={**tiny_recipe().options, "flip": Option(False, flag, "flip")})
    checked = recipe.checked_option("flip")  # the wrapper a recipe's option gets
    assert checked.__wrapped__ is flag and cli._is_on_off(checked) and cli._is_on_off(flag)
    assert not cli._is_on_off(recipe.checked_option("hidden")) and not cli._is_on_off(positive_int)
    assert parse_run_command_of(recipe, ["--flip"]).options["flip"] is True
    assert parse_run_command_of(recipe, ["--no-flip"]).options["flip"] is False


def test_a_check_keeps_its_name_for_argparse():
    assert cli.argparse_type(positive_int).__name__ == "positive_int"
    assert cli.argparse_type(dataclasses.replace).__name__ == "replace"
    assert cli.argparse_type(type("Check", (), {"__call__": lambda self, v: v})()).__name__ == "value"


def test_a_config_is_a_file_or_one_of_the_recipes_presets(tmp_path, monkeypatch):
    recipe = tiny_recipe()
    monkeypatch.chdir(tmp_path)
    assert cli.config_path("quick", recipe) == str(recipe.presets()["quick"])
    for given in ("mine.yaml", "mine.yml", "dir/mine"):
        assert cli.config_path(given, recipe) == given  # a file: read, or refused as missing, by load_yaml
    (tmp_path / "quick").write_text("max_epochs: 1\n")
    assert cli.config_path("quick", recipe) == "quick"  # a file here wins over the preset of its name
    with pytest.raises(UsageError) as refused:
        cli.config_path("fast", recipe)
    assert str(refused.value) == "--config fast: no such file, and not one of the recipe's presets (quick)"
    with pytest.raises(UsageError, match=r"presets \(article, fast, gpu-ddp\)$"):
        cli.config_path("slow", load_recipe("project.recipe"))
    no_presets = dataclasses.replace(recipe, package="tests.tiny_recipe.configs")
    with pytest.raises(UsageError, match=r"presets \(it has none\)$"):
        cli.config_path("fast", no_presets)


@pytest.mark.parametrize(("argv", "rest", "trainer"), [
    (["--max-epochs", "2", "--trainer.accumulate_grad_batches", "4", "--trainer.gradient_clip_val=0.5", "x"],
     ["--max-epochs", "2", "x"], {"accumulate_grad_batches": 4, "gradient_clip_val": 0.5}),
    (["--trainer.profiler", "simple", "--trainer.benchmark=true", "--trainer.limit_val_batches", "null"], [],
     {"profiler": "simple", "benchmark": True, "limit_val_batches": None}),
])
def test_trainer_tokens_are_taken_out_and_typed_as_yaml_reads_them(argv, rest, trainer):
    assert cli.split_trainer_args(argv) == (rest, trainer)


@pytest.mark.parametrize(("argv", "error"), [
    (["--trainer.max_steps"], "--trainer.max_steps: needs a value, e.g. --trainer.max_steps VALUE"),
    (["--trainer.max_steps", "--lr", "1"], "--trainer.max_steps: needs a value, e.g. --trainer.max_steps VALUE"),
    (["--trainer.=4"], "--trainer.: name a Trainer argument, e.g. --trainer.accumulate_grad_batches 4"),
])
def test_a_trainer_token_without_a_name_or_a_value_is_refused(argv, error):
    with pytest.raises(UsageError) as refused:
        cli.split_trainer_args(argv)
    assert str(refused.value) == error


def test_print_config_shows_the_data_folder_the_run_would_use(tmp_path):
    import yaml

    from helpers import run_script

    from_env = run_script("train.py", "--print-config", env={"DATA_DIR": str(tmp_path / "from-env")})
    assert from_env.returncode == 0, from_env.stderr
    assert yaml.safe_load(from_env.stdout)["data_dir"] == str(tmp_path / "from-env")
    given = run_script("train.py", "--print-config", "--data-dir", "mine", cwd=tmp_path,
                       env={"DATA_DIR": str(tmp_path / "from-env")})
    assert yaml.safe_load(given.stdout)["data_dir"] == str(tmp_path / "mine")  # the flag wins, from where it ran
