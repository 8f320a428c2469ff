"""Every door checks what comes in, as strictly as train.py's command line: the Python API, the scaffold, the
installer, the storage URL, a checkpoint's own settings, read-only and wrong destinations, strategies, and the
small lies of a flag read otherwise than written. Each one line (or a library's own error naming the argument)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import HANG_S, ROOT, draw_shapes, run_script_warm, tiny_config, tiny_recipe, train
from project import api, scaffold
from project.config.schema import RunConfig
from project.contract import Recipe, RecipeError, load_recipe
from project.errors import CheckpointError, Terminated, UsageError, hide_credentials_of, redact, run_cli

# ---------------------------------------------------------------- 1, 2: the scaffold's names and its writing

@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return draw_shapes(tmp_path_factory.mktemp("doors") / "pictures", per_class=6)


@pytest.mark.parametrize("name", ["numpy", "yaml", "optuna", "__pycache__", "json"])
def test_a_new_recipe_named_as_an_importable_module_is_refused(images, tmp_path, name):
    with pytest.raises(UsageError) as refused:
        scaffold.recipe_from_images(name, images, tmp_path)
    assert f"{name!r}: a module of that name exists already (" in str(refused.value)
    assert "would hide it from every script" in str(refused.value) and list(tmp_path.iterdir()) == []


def test_a_new_recipe_named_as_a_folder_git_ignores_is_refused(images, tmp_path):
    with pytest.raises(UsageError) as refused:
        scaffold.recipe_from_images("data", images, tmp_path)
    assert str(refused.value) == ("'data': the template's .gitignore leaves data/ out of git, so the recipe would "
                                  "never be committed; choose another name")
    assert {"data", "benchmark-results", "mutants", "__pycache__"} <= scaffold.ignored_folders()


def test_the_script_refuses_a_name_that_would_break_the_project_in_one_line(images, tmp_path):
    done = run_script_warm("new_recipe.py", "numpy", "--images", str(images), "--out", str(tmp_path))
    assert done.returncode == 2 and done.stderr.startswith("new_recipe.py: error: 'numpy': a module of that name")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "numpy").exists()


def stop_after(function_name: str, monkeypatch) -> None:
    """SIGTERM to this process right after ``project.scaffold.<function_name>`` returns (its first call)."""
    real = getattr(scaffold, function_name)
    calls = []

    def then_stopped(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(scaffold, function_name, then_stopped)


@pytest.mark.parametrize("point", ["write_templates", "training_set", "measured_statistics", "write_examples"])
def test_a_scaffold_stopped_by_sigterm_at_any_point_leaves_nothing(images, tmp_path, monkeypatch, point):
    stop_after(point, monkeypatch)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match="stopped by SIGTERM: nothing was written"):
        scaffold.recipe_from_images("stopped", images, tmp_path)
    assert list(tmp_path.iterdir()) == []  # no package, no hidden half of one
    assert signal.getsignal(signal.SIGTERM) is handler  # the caller's handler again
    made = scaffold.recipe_from_images("stopped", images, tmp_path)  # the next try is not refused
    assert sorted(p.name for p in made.package.iterdir()) == ["__init__.py", "data.py", "examples", "model.py"]
    umask = os.umask(0)
    os.umask(umask)
    assert made.package.stat().st_mode & 0o777 == 0o777 & ~umask  # readable as any folder mkdir makes
    assert "mean = (0.5,)" not in (made.package / "data.py").read_text()  # the placeholder never left behind


def test_a_copy_stopped_by_sigterm_leaves_nothing(tmp_path, monkeypatch):
    real = shutil.copytree

    def copied_then_stopped(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(scaffold.shutil, "copytree", copied_then_stopped)
    with pytest.raises(Terminated):
        scaffold.recipe_from_package("copied", "tests.second_recipe", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_new_recipe_py_killed_by_sigterm_mid_write_leaves_no_package_or_a_whole_one(tmp_path):
    pictures = draw_shapes(tmp_path / "pictures", per_class=80)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "new_recipe.py"), "late", "--images",
                             str(pictures), "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        while proc.poll() is None and not list(out.glob(".late.partial-*/*.py")):
            time.sleep(0.005)  # the staging folder's first file is the moment to stop it
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
    left = sorted(p.name for p in out.iterdir())
    if proc.returncode == 0:  # it finished before the signal came: the whole package
        assert left == ["late"] and (out / "late" / "examples").is_dir()
    else:
        assert proc.returncode == 128 + signal.SIGTERM and left == [], (proc.returncode, left, stderr)
        assert stderr == "new_recipe.py: stopped by SIGTERM: nothing was written\n"


def test_out_must_be_a_folder_that_can_be_written(images, tmp_path):
    (tmp_path / "README.md").write_text("a file")
    with pytest.raises(UsageError, match=r"^--out .*README.md: not a folder$"):
        scaffold.recipe_from_images("shapes", images, tmp_path / "README.md")


# ---------------------------------------------------------------- 3, 4, 5: the Python API

@pytest.fixture(scope="module")
def recipe():
    return load_recipe("project.recipe")


@pytest.mark.parametrize("changes, said", [
    ({"batch_size": 0}, "RunConfig.replace(batch_size=...): must be a positive integer, got 0"),
    ({"lr": -5.0}, "RunConfig.replace(lr=...): must be a positive number, got -5.0"),
    ({"lr": "1_0"}, "RunConfig.replace(lr=...): not a valid float: '1_0'"),
    ({"optimizer": "lbfgs"}, "RunConfig.replace(optimizer=...): "),
    ({"bogus": 1}, "RunConfig.replace(bogus=...): no such setting"),
    ({"trainer": [1]}, "RunConfig.replace(trainer=...): expected a mapping of Trainer arguments, got list"),
])
def test_replace_checks_each_value_as_its_flag_does(recipe, changes, said):
    config = RunConfig.for_recipe(recipe, fast_dev_run=True)
    with pytest.raises(UsageError) as refused:
        config.replace(**changes)
    assert str(refused.value).startswith(said)


def test_replace_keeps_a_good_value_typed_and_the_options(recipe):
    config = RunConfig.for_recipe(recipe).replace(batch_size="128", lr="0.5", hidden=[64], max_epochs=2)
    assert (config.batch_size, config.lr, config.options["hidden"], config.max_epochs) == (128, 0.5, [64], 2)


def test_for_recipe_names_an_unknown_setting_and_the_options(recipe):
    with pytest.raises(UsageError) as refused:
        RunConfig.for_recipe(recipe, bogus=1)
    assert str(refused.value) == ("RunConfig.for_recipe: unknown setting 'bogus' (settings are train.py's flags by "
                                  "their Python names, e.g. max_epochs, and the recipe's options: hidden)")


@pytest.mark.parametrize("call, said", [
    (lambda r: api.predict(r, "README.md", ckpt="x.ckpt"),
     "predict(inputs=...): expected a list of image files or folders, got str 'README.md'; for one, pass "
     "['README.md']"),
    (lambda r: api.predict(r, [3], ckpt="x.ckpt"), "predict(inputs=...): expected a path (str or pathlib.Path), "
                                                   "got int 3"),
    (lambda r: api.predict(r, ["a.png"], ckpt="x.ckpt", topk=0),
     "predict(topk=...): expected a whole number of classes, 1 or more, got int 0"),
    (lambda r: api.predict(r, ["a.png"], ckpt="x.ckpt", topk=True), "predict(topk=...): expected a whole number"),
    (lambda r: api.evaluate(r, ckpt=123), "evaluate(ckpt=...): expected a path (str or pathlib.Path), got int 123"),
    (lambda r: api.evaluate("project.recipe"), "evaluate(recipe=...): expected a Recipe "
                                               "(project.api.load_recipe('package')), got str 'project.recipe'"),
    (lambda r: api.train(RunConfig.for_recipe(r), r, callbacks=[object()]),
     "train(callbacks=...): expected Lightning callbacks (lightning.pytorch.Callback), got object <object object"),
    (lambda r: api.train({"lr": 0.1}, r), "train(config=...): expected a RunConfig"),
    (lambda r: api.load_recipe(None), "load_recipe(package): expected a package's dotted name (str), such as "
                                      "'my_recipes.digits', got NoneType None"),
])
def test_the_apis_arguments_are_checked_naming_the_argument(recipe, call, said):
    with pytest.raises(UsageError) as refused:  # RecipeError is one
        call(recipe)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_paths_may_be_pathlib_paths_and_a_long_value_is_said_cut(recipe, tmp_path):
    with pytest.raises(CheckpointError) as missing:  # a Path is taken as its text: the checkpoint is looked for
        api.evaluate(recipe, ckpt=tmp_path / "missing.ckpt")
    assert str(tmp_path / "missing.ckpt") in str(missing.value)
    with pytest.raises(UsageError) as refused:
        api.predict(recipe, ["a.png"], ckpt=["x" * 100])
    assert str(refused.value) == ("predict(ckpt=...): expected a path (str or pathlib.Path), got list "
                                  f"{repr(['x' * 100])[:57]}...")


def test_a_recipe_whose_module_names_no_class_is_one_line():
    made = Recipe(name="odd", module="os:path", datamodule="os:sep", description="", data_help="")
    with pytest.raises(RecipeError) as refused:
        made.module_class()
    assert str(refused.value) == ("recipe project.recipe: module 'os:path': is a module, not a class; name the class "
                                  "(e.g. '.model:LitNet')")
    with pytest.raises(RecipeError, match="datamodule 'os:sep': is a str, not a class"):
        made.datamodule_class()
    with pytest.raises(RecipeError, match=r"Recipe\(module=...\): must be '.module:Class'"):
        Recipe(name="odd", module="model.LitNet", datamodule=".d:D", description="", data_help="")


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "", "-rf", "x" * 101])
def test_a_recipe_name_is_one_plain_folder_name(name):
    with pytest.raises(RecipeError, match=r"^Recipe\(name=...\): must be "):
        Recipe(name=name, module=".m:C", datamodule=".d:D", description="", data_help="")


# ---------------------------------------------------------------- 6: passwords, however the URL is written

MALFORMED = ["postgresql://user:{pw}@127.0.0.1:1/db", "postgresql:/user:{pw}@127.0.0.1/db", "user:{pw}@host:5432/db",
             "postgresql+psycopg://user:{pw}@127.0.0.1:1/db?sslmode=require", "mysql:user:{pw}@h/db"]


def sweep_error(monkeypatch, capsys, storage: str, data: Path, tmp_path: Path, *extra: str) -> str:
    """What sweep.py prints when ``storage`` fails, in this process: its parser, its prepare, its run_cli."""
    from project.config.tool_args import parse_sweep_args
    from project.sweeps.study import prepare


    space = tmp_path / "space.yaml"
    space.write_text("fixed:\n  max_epochs: 1\nparams:\n  lr: {type: float, low: 0.01, high: 0.3}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--storage", storage, "--space", str(space), "--data-dir",
                                      str(data), "--logdir", str(tmp_path / "logs"), *extra])
    args = parse_sweep_args(tiny_recipe(), None)
    with pytest.raises(SystemExit):
        run_cli(lambda: prepare(tiny_recipe(), args) and 0, "sweep.py", debug=args.debug)
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.parametrize("form", MALFORMED)
@pytest.mark.parametrize("debug", [False, True])
def test_a_password_in_a_malformed_storage_url_is_never_printed(monkeypatch, capsys, shared_tiny_data, tmp_path,
                                                               form, debug):
    printed = sweep_error(monkeypatch, capsys, form.format(pw="s3 cret"), shared_tiny_data, tmp_path,
                          *(["--debug"] if debug else []))
    assert "sweep.py: error: --storage " in printed and "s3 cret" not in printed and "***" in printed, printed


PASSWORDS = st.text(string.ascii_letters + string.digits + " !$%()*+-.:/@_~", min_size=6, max_size=20).filter(
    lambda s: s.strip() == s and any(c.isalpha() for c in s) and any(c.isdigit() for c in s))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(PASSWORDS, st.sampled_from(MALFORMED + ["https://host/db?password={pw}", "host=h password={pw}"]))
def test_no_output_of_sweep_py_holds_the_password_however_the_storage_is_written(
        monkeypatch, capsys, shared_tiny_data, tmp_path_factory, password, form):
    if "password=" in form:  # a key's value runs to the next space: the password must be one word there
        password = password.replace(" ", "")
    printed = sweep_error(monkeypatch, capsys, form.format(pw=password), shared_tiny_data,
                          tmp_path_factory.mktemp("pw"))
    assert password not in printed, printed


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(PASSWORDS, st.sampled_from(MALFORMED), st.booleans())
def test_no_output_of_train_py_holds_the_password_of_its_data_folder(capsys, tmp_path_factory, password, form,
                                                                     debug):
    """train.py's own main, in this process, on a --data-dir that carries a password and holds no data."""
    import runpy

    logs = tmp_path_factory.mktemp("pw") / "logs"
    argv = ["train.py", "--data-dir", form.format(pw=password), "--logdir", str(logs), "--max-epochs", "1",
            *(["--debug"] if debug else [])]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as ended:
            runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")
    captured = capsys.readouterr()
    assert ended.value.code != 0 and "train.py: error: " in captured.err
    assert password not in captured.out + captured.err, captured.err
    written = [p for p in logs.rglob("*") if p.is_file()] if logs.exists() else []
    assert not [p for p in written if password in p.read_text(errors="replace")]


def test_a_run_whose_data_folder_carries_a_password_writes_it_nowhere(shared_tiny_data, tmp_path):
    """A folder named like a URL with a password (a mount of a bucket, say): the run's files and output mask it."""
    data = tmp_path / "user:s3 cret@bucket"
    shutil.copytree(shared_tiny_data, data)
    done = run_script_warm("train.py", "--data-dir", str(data), "--logdir", str(tmp_path / "logs"), "--max-epochs",
                           "1", "--batch-size", "32", "--val-size", "40", "--accelerator", "cpu")
    assert done.returncode == 0, done.stderr
    assert "s3 cret" not in done.stdout + done.stderr
    written = [p for p in (tmp_path / "logs").rglob("*") if p.is_file() and p.suffix in (".json", ".yaml", ".csv")]
    assert written and not [p for p in written if "s3 cret" in p.read_text(errors="replace")]


# ---------------------------------------------------------------- 7: the installer

spec = importlib.util.spec_from_file_location("install_torch_doors", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(spec)
sys.modules["install_torch_doors"] = install_torch
spec.loader.exec_module(install_torch)
Build, Wanted = install_torch.Build, install_torch.Wanted


@pytest.mark.parametrize("installed, wanted, gpu, reachable, build", [
    ("2.14.1+cpu", Wanted.CUDA, False, True, Build.CUDA_AS_ASKED),  # the CPU build is there: CUDA asked for
    ("2.14.1", Wanted.CUDA, False, True, Build.ALREADY_INSTALLED),
    (None, Wanted.CUDA, False, True, Build.CUDA_AS_ASKED),
    ("2.14.1", Wanted.CPU, True, True, Build.CPU_AS_ASKED),  # a GPU machine that wants the small build
    ("2.14.1+cpu", Wanted.CPU, True, True, Build.ALREADY_INSTALLED),
    (None, Wanted.CPU, False, False, Build.CPU_INDEX_UNREACHABLE),
    ("2.14.1+cpu", Wanted.AUTO, True, True, Build.ALREADY_INSTALLED),
])
def test_torch_build_decides_what_is_installed(installed, wanted, gpu, reachable, build):
    assert install_torch.choose(installed=installed, pinned="2.14.1", has_nvidia_gpu=gpu, wanted=wanted,
                                cpu_index_reachable=reachable) is build


def test_what_the_installer_says_is_so():
    asked = install_torch.described(Build.CUDA_AS_ASKED, "2.14.1", "2.14.1+cpu")
    assert asked.startswith("TORCH_BUILD=cuda: torch 2.14.1 from PyPI, its CUDA build") and "GPU is here" not in asked
    assert asked.endswith("in place of 2.14.1+cpu")
    assert install_torch.described(Build.CPU_AS_ASKED, "2.14.1", None).startswith("TORCH_BUILD=cpu: torch 2.14.1, "
                                                                                  "its CPU build")


@pytest.mark.parametrize("value", ["CUDA", "cuda ", "rocm", "gpu"])
def test_a_torch_build_no_one_reads_is_refused_in_one_line(value):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "install_torch.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=HANG_S, env={**os.environ, "TORCH_BUILD": value})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"install_torch.py: error: TORCH_BUILD={value!r}: must be one of auto, cuda, cpu (or unset)\n"
    assert install_torch.wanted_build("") is Wanted.AUTO and install_torch.wanted_build("cpu") is Wanted.CPU


@pytest.mark.parametrize("content, said", [(None, "cannot read it (No such file or directory)"),
                                           (b"torch==2.14.1\n\xff\xfe\n", "not UTF-8 text"),
                                           (b"numpy==2\n", "pins no torch or torchvision version")])
def test_an_unreadable_constraints_file_is_one_line(tmp_path, monkeypatch, capsys, content, said):
    path = tmp_path / "constraints.txt"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(install_torch, "CONSTRAINTS", path)
    monkeypatch.setattr(sys, "argv", ["install_torch.py", "--dry-run"])
    assert install_torch.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("install_torch.py: error: ") and said in err and err.count("\n") == 1


# ---------------------------------------------------------------- 8: the LR as trained

def test_the_float32_limit_holds_for_the_lr_as_scaled(shared_tiny_data, tmp_path):
    from project.training.tuning import LrScaling, checked_scaled_lr

    assert checked_scaled_lr(LrScaling(3e38, 256, 256, False)) == 3e38
    config = tiny_config(shared_tiny_data, tmp_path, lr=3e38, scale_lr=True, batch_size=512, fast_dev_run=True)
    with pytest.raises(UsageError) as refused:
        train(config)
    assert str(refused.value) == ("--lr 3e+38 x 512/256 (the linear scaling rule) = 6e+38: must fit a float32 (at "
                                  "most 3.4e+38), got 6e+38; give a smaller --lr, or --no-scale-lr")


# ---------------------------------------------------------------- 9: a checkpoint's own settings

@pytest.mark.parametrize("hidden, said", [
    ("abc", "its hyper_parameters' hidden 'abc': not a valid int: 'abc'"),
    ([1e12], "its hyper_parameters' hidden [1000000000000.0]: not a valid int: 1000000000000.0"),
    ([10**12], "its hyper_parameters (hidden [1000000000000]) build a LitTiny its weights do not fit"),
    ([64], "its hyper_parameters (hidden [64]) build a LitTiny its weights do not fit"),
])
def test_a_checkpoints_settings_are_checked_as_flags_and_against_its_weights(trained, tmp_path, hidden, said):
    from project.results.evaluation import load_classifier

    state = torch.load(trained["results"]["best_checkpoint"], map_location="cpu", weights_only=True)
    state["hyper_parameters"]["hidden"] = hidden
    path = tmp_path / "edited.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as refused:
        load_classifier(tiny_recipe(), ckpt=str(path))  # 10**12 would ask for 3e15 bytes: refused first
    assert str(refused.value).startswith(f"{path}: {said}")


# ---------------------------------------------------------------- 10: read-only and wrong destinations

@contextlib.contextmanager
def read_only(folder: Path, fill=lambda folder: None):
    """``folder`` as a read-only mount (a tmpfs filled by ``fill``, then remounted read-only): root writes
    through any permission bits, not through a read-only mount."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only mount needs mount(8) and the right to mount: {mounted.stderr.strip()}")
    try:
        fill(folder)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_resuming_a_run_on_a_read_only_mount_is_one_line(trained, tmp_path):
    from project.reliability.run_folder import RunLock

    def fill(folder: Path) -> None:
        shutil.copytree(trained["run"], folder / "version_0")

    with read_only(tmp_path / "ro", fill) as folder:
        with pytest.raises(UsageError) as refused:
            RunLock(folder / "version_0").acquire("--resume")
        assert str(refused.value) == (f"--resume: {folder / 'version_0'} cannot be written (Read-only file system): "
                                      "a run writes its checkpoints and logs into its folder; copy it somewhere "
                                      "writable first")
        done = run_script_warm("train.py", "--resume", str(folder / "version_0" / "checkpoints" / "last.ckpt"),
                               "--data-dir", str(trained["data"]))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines()[-1] == f"train.py: error: {refused.value}"  # after the line saying what


def test_new_recipe_into_a_read_only_folder_is_one_line(images, tmp_path):
    with read_only(tmp_path / "ro") as folder:
        with pytest.raises(UsageError, match=r"^--out .*/ro/deeper: cannot write there \(Read-only file system\)$"):
            scaffold.recipe_from_images("shapes", images, folder / "deeper")
        done = run_script_warm("new_recipe.py", "shapes", "--images", str(images), "--out", str(folder))
    assert done.returncode == 2 and done.stderr == (f"new_recipe.py: error: --out {folder}: cannot write there "
                                                    "(Read-only file system)\n")


def test_sweep_py_with_its_logdir_on_a_read_only_mount_is_one_line(shared_tiny_data, tmp_path, monkeypatch, capsys):
    from project.config.tool_args import parse_sweep_args
    from project.sweeps.study import prepare

    space = tmp_path / "space.yaml"
    space.write_text("fixed:\n  max_epochs: 1\nparams:\n  lr: {type: float, low: 0.01, high: 0.3}\n")
    with read_only(tmp_path / "ro") as folder:
        monkeypatch.setattr(sys, "argv", ["sweep.py", "--space", str(space), "--data-dir", str(shared_tiny_data),
                                          "--logdir", str(folder / "logs")])
        with pytest.raises(UsageError) as refused:
            prepare(tiny_recipe(), parse_sweep_args(tiny_recipe(), None))
    assert str(refused.value) == f"--logdir {folder / 'logs'}: cannot write there (Read-only file system)"


# ---------------------------------------------------------------- 11: strategies

@pytest.mark.parametrize("settings_, said", [
    ({"strategy": "deepspeed"}, "--strategy deepspeed needs the deepspeed package, which is not installed here: pip "
                                "install deepspeed, or choose another strategy"),
    ({"strategy": "deepspeed_stage_2", "accelerator": "cpu"}, "--strategy deepspeed_stage_2 needs the deepspeed"),
    ({"strategy": "single_device", "devices": 2, "accelerator": "cpu"},
     "--strategy single_device trains in one process on one device, and this run asks for 2: give --devices 1, or "
     "drop --strategy"),
])
def test_a_strategy_that_cannot_run_here_is_one_line(settings_, said):
    from project.hardware.devices import validate_hardware

    if importlib.util.find_spec("deepspeed") is not None and "deepspeed" in settings_["strategy"]:
        pytest.skip("DeepSpeed is installed here")
    with pytest.raises(UsageError) as refused:
        validate_hardware(RunConfig(**settings_))
    assert str(refused.value).startswith(said)
    validate_hardware(RunConfig(strategy="single_device", devices=1, accelerator="cpu"))  # one device: fine


# ---------------------------------------------------------------- 12: small lies

@pytest.mark.parametrize("argv, said", [
    (["--lr", "1_0"], "argument --lr: not a valid float: '1_0'"),
    (["--batch-size", "6_4"], "argument --batch-size: not a valid int: '6_4'"),
    (["--val-size", "0.0"], "argument --val-size: expected a count or a share between 0 and 1, got '0.0'"),
    (["--val-size", "1.5"], "argument --val-size: expected a count or a share between 0 and 1, got '1.5'"),
    (["--config", ""], "--config: needs a YAML file or a preset's name, got an empty one"),
])
def test_a_flag_is_read_as_written_or_refused(capsys, argv, said):
    from helpers import parse_run_config

    with pytest.raises(SystemExit):
        parse_run_config(argv)
    assert capsys.readouterr().err == f"train.py: error: {said}\n"


def test_more_sweep_workers_than_the_cores_can_share_is_one_line():
    from project.hardware.devices import cores
    from project.sweeps.workers import plan_workers

    with pytest.raises(UsageError) as refused:
        plan_workers(1000, RunConfig(accelerator="cpu"), {})
    assert str(refused.value) == (f"--workers 1000: 1000 trials at once on {cores()} CPU core(s) would take turns "
                                  f"more than they train; use at most {2 * cores()}")
    assert len(plan_workers(2 * cores(), RunConfig(accelerator="cpu"), {})) == 2 * cores()


def test_a_class_folder_named_with_a_newline_or_looping_back_is_said_as_such(tmp_path):
    draw_shapes(tmp_path / "newline", per_class=2)
    (tmp_path / "newline" / "circle").rename(tmp_path / "newline" / "cir\ncle")
    with pytest.raises(UsageError) as refused:
        scaffold.survey(tmp_path / "newline")
    assert "class folder 'cir\\ncle': its name holds a control character" in str(refused.value)
    assert "\n" not in str(refused.value)
    draw_shapes(tmp_path / "loop", per_class=2)
    (tmp_path / "loop" / "zigzag").symlink_to(tmp_path / "loop")
    with pytest.raises(UsageError) as refused:
        scaffold.survey(tmp_path / "loop")
    assert str(refused.value) == (f"--images {tmp_path / 'loop'}: class folder {tmp_path / 'loop' / 'zigzag'} is a "
                                  f"link to {tmp_path / 'loop'}, which holds the class folders themselves (a loop); "
                                  "make it a folder of that class's images")


def test_the_secret_of_a_url_is_found_however_it_is_written():
    from project.errors import userinfo_password

    assert [userinfo_password(form.format(pw="s3 cr@t")) for form in MALFORMED] == ["s3 cr@t"] * 4 + ["user:s3 cr@t"]
    assert userinfo_password("postgresql://host/db") is None and userinfo_password("a@b") is None
    assert userinfo_password("user:/0000A@host") == "/0000A"  # no scheme: a password may start with '/'
    assert userinfo_password("postgresql://user@host/db") is None  # a user, no password
    hide_credentials_of("postgresql:/me:lo ng@h/db")  # as a parser that was given it does
    assert redact("failed: postgresql:/me:lo ng@h/db (lo ng)") == "failed: postgresql:/me:***@h/db (***)"
