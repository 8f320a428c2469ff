"""Damaged run records and bad recipe names: one line or a run listed as damaged, never a traceback.

Each field of ``run.json`` and ``results.json`` is damaged in each way a hand, a full disk or another tool can
(wrong type, NaN, out of range, undecodable, cut short), each in its own copy of a finished run beside an intact,
older one; then every script that reads records runs over them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, ROOT, one_line_error, run_script, run_script_warm

# (file, what is written: a field and its value, or the whole file's bytes, the reason runs.py shows)
CASES = [
    ("run.json", ("started", "abc"), "run.json: started is not a time"),
    ("run.json", ("started", 1e30), "run.json: started is not a time"),
    ("run.json", ("started", float("nan")), "run.json: started is not a time"),
    ("run.json", ("started", -5), "run.json: started is not a time"),
    ("run.json", ("state", 3), "run.json: state is not one of running, finished, stopped, failed"),
    ("run.json", ("state", "exploded"), "run.json: state is not one of running, finished, stopped, failed"),
    ("run.json", ("pid", "1234"), "run.json: pid is not a process id"),
    ("run.json", ("host", ["a"]), "run.json: host is not a host name"),
    ("run.json", ("limited", "max_steps"), "run.json: limited is not a list of Trainer limits"),
    ("run.json", ("step", -1), "run.json: step is not a step number"),
    ("run.json", ("step", 2.5), "run.json: step is not a step number"),
    ("run.json", ("best_checkpoint", 5), "run.json: best_checkpoint is not a file name"),
    ("run.json", ("best_checkpoint", ["best.ckpt"]), "run.json: best_checkpoint is not a file name"),
    ("run.json", ("best_score", float("inf")), "run.json: best_score is not a finite number"),
    ("run.json", ("error", 7), "run.json: error is not a line of text"),
    ("run.json", b"\xff\xfe\x00{not text", "run.json: not UTF-8 text"),
    ("run.json", "cut", "run.json: not valid JSON (cut short or edited: line"),
    ("run.json", b"", "run.json: empty"),
    ("run.json", b"[1, 2]", "run.json: holds a list, not a JSON object"),
    ("results.json", ("test/acc", "0.9"), "results.json: test/acc is not an accuracy between 0 and 1"),
    ("results.json", ("test/acc", 1.5), "results.json: test/acc is not an accuracy between 0 and 1"),
    ("results.json", ("test/acc", float("nan")), "results.json: test/acc is not an accuracy between 0 and 1"),
    ("results.json", ("weights", 5), "results.json: weights is not a path"),
    ("results.json", ("weights", ["model.pth"]), "results.json: weights is not a path"),
    ("results.json", ("best_checkpoint", {"a": 1}), "results.json: best_checkpoint is not a path"),
    ("results.json", ("lr", -0.1), "results.json: lr is not a positive number"),
    ("results.json", ("world_size", 0), "results.json: world_size is not a positive whole number"),
    ("results.json", b"\x80\x81", "results.json: not UTF-8 text"),
    ("results.json", "cut", "results.json: not valid JSON (cut short or edited: line"),
]


def damage(folder: Path, name: str, change: object) -> None:
    path = folder / name
    if isinstance(change, bytes):
        path.write_bytes(change)
    elif change == "cut":
        text = path.read_text()
        path.write_text(text[: len(text) // 2])
    else:
        key, value = change
        path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))  # NaN and Infinity as json writes


@pytest.mark.parametrize(("name", "change", "reason"), CASES)
def test_the_checked_reader_names_each_damage(tmp_path, name, change, reason):
    """In-process, each case alone: the reader's one line, and an intact record of the same run read as written."""
    from project.reliability.run_folder import RESULT_FIELDS, RUN_FIELDS, DamagedRecord, read_mapping

    fields = RUN_FIELDS if name == "run.json" else RESULT_FIELDS
    intact = {"run.json": {"state": "finished", "pid": 7, "host": "h", "limited": [], "error": None,
                           "started": 1.7e9, "step": 14, "best_checkpoint": "best.ckpt", "best_score": 0.9},
              "results.json": {"test/loss": 0.3, "test/acc": 0.9, "val/acc_best": 0.91, "best_checkpoint": "/b.ckpt",
                               "last_checkpoint": "/l.ckpt", "weights": "/m.pth", "global_batch": 32,
                               "world_size": 1, "precision": "32-true", "lr": 0.1, "test/f1": 0.5}}[name]
    (tmp_path / name).write_text(json.dumps(intact, indent=2))
    assert read_mapping(tmp_path / name, fields) == intact
    damage(tmp_path, name, change)
    with pytest.raises(DamagedRecord) as damaged:
        read_mapping(tmp_path / name, fields)
    assert damaged.value.reason.startswith(reason) and "\n" not in str(damaged.value)
    assert read_mapping(tmp_path / "missing.json", fields) == {}


def test_the_edges_of_each_range_are_records_a_run_writes(tmp_path):
    """Step 0 (a run stopped before its first step), accuracies of exactly 0 and 1, a start just after the epoch:
    all read as written; one past each edge is damage; a record that cannot be read at all is one line too."""
    from project.reliability.run_folder import RESULT_FIELDS, RUN_FIELDS, DamagedRecord, read_mapping

    edges = [("run.json", RUN_FIELDS, {"step": 0, "started": 0.5, "best_score": None, "error": None}),
             ("results.json", RESULT_FIELDS, {"test/acc": 0.0, "val/acc_best": 1.0, "weights": None}),
             ("results.json", RESULT_FIELDS, {"test/acc": 1.0, "val/acc_best": float("nan")})]
    for name, fields, values in edges:
        (tmp_path / name).write_text(json.dumps(values))
        assert json.dumps(read_mapping(tmp_path / name, fields)) == json.dumps(values)
    for name, fields, values in [("run.json", RUN_FIELDS, {"started": 0}), ("run.json", RUN_FIELDS, {"started": 1e10}),
                                 ("results.json", RESULT_FIELDS, {"test/acc": -1e-9}),
                                 ("results.json", RESULT_FIELDS, {"global_batch": 0})]:
        (tmp_path / name).write_text(json.dumps(values))
        with pytest.raises(DamagedRecord):
            read_mapping(tmp_path / name, fields)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "run.json").mkdir()  # another tool made a folder of that name
    with pytest.raises(DamagedRecord, match=r"run.json: is a directory, not a file;"):
        read_mapping(tmp_path / "folder" / "run.json", RUN_FIELDS)


@pytest.fixture(scope="module")
def damaged_runs(trained, tmp_path_factory) -> dict:
    """The trained run as version_0 (intact, oldest) and one copy per case (version_1..), each damaged its way."""
    logs = tmp_path_factory.mktemp("damaged") / "logs"
    parent = logs / "tiny"
    shutil.copytree(trained["run"], parent / "version_0", ignore=shutil.ignore_patterns(".run.lock"))
    started = json.loads((parent / "version_0" / "run.json").read_text())["started"]
    for number, (name, change, _) in enumerate(CASES, start=1):
        folder = parent / f"version_{number}"
        shutil.copytree(parent / "version_0", folder)
        record = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**record, "started": started + number}))  # newer than version_0
        damage(folder, name, change)
    return {"logs": logs, "data": trained["data"], "parent": parent}


def test_runs_lists_each_damaged_run_with_its_reason_and_the_intact_one_as_it_is(damaged_runs):
    done = run_script_warm("runs.py", "--logdir", str(damaged_runs["logs"]), "--name", "tiny")
    assert done.returncode == 0 and done.stderr == "" and "Traceback" not in done.stdout, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    for number, (_, _, reason) in enumerate(CASES, start=1):
        assert f"damaged ({reason}" in lines[str(damaged_runs["parent"] / f"version_{number}")]
    intact = lines[str(damaged_runs["parent"] / "version_0")]
    assert "finished" in intact and "best-epoch" in intact


@pytest.mark.parametrize("script", ["evaluate.py", "predict.py"])
def test_evaluate_and_predict_pass_over_damaged_runs_to_the_intact_one(damaged_runs, script, tmp_path):
    image = tmp_path / "digit.png"
    if script == "predict.py":
        from PIL import Image

        Image.new("L", (28, 28), 0).save(image)
    args = [str(image)] if script == "predict.py" else ["--data-dir", str(damaged_runs["data"])]
    done = run_script_warm(script, *args, "--logdir", str(damaged_runs["logs"]))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{damaged_runs['parent'] / 'version_0'}" in done.stderr  # the one it used, said on stderr
    passed = [line for line in done.stderr.splitlines() if ": passing over " in line]
    assert len(passed) == len(CASES) and all("damaged (" in line for line in passed)


@pytest.mark.slow
def test_resume_last_passes_over_them_and_one_named_is_refused_in_one_line(damaged_runs):
    common = ("--logdir", str(damaged_runs["logs"]), "--data-dir", str(damaged_runs["data"]))
    last = run_script("train.py", "--resume", "last", *common)
    assert last.returncode == 0 and "Traceback" not in last.stderr, last.stderr
    assert f"{damaged_runs['parent'] / 'version_0'} is finished" in last.stderr  # the intact run was the one chosen
    passed = [line for line in last.stderr.splitlines() if ": passing over " in line]
    assert len(passed) == len(set(passed)) == len(CASES), passed  # each damaged run said once

    named = damaged_runs["parent"] / "version_1" / "checkpoints" / "last.ckpt"
    refused = run_script("train.py", "--resume", str(named), *common)
    assert refused.returncode == 2
    line = one_line_error(refused.stderr, after=(r"resuming .* with its run.s settings",))
    assert "run.json: started is not a time; repair or delete it" in line


def test_every_damaged_record_named_for_a_resume_is_one_line(damaged_runs):
    """Each case, named: the in-process resume meets the reason before anything in the folder changes."""
    from project.config.schema import RunConfig
    from project.errors import UsageError
    from project.reliability.resume import Resume, continue_in_its_folder
    from project.reliability.run_folder import release_all

    for number, (name, _, reason) in enumerate(CASES, start=1):
        folder = damaged_runs["parent"] / f"version_{number}"
        before = written(folder)
        resume = Resume(folder / "checkpoints" / "last.ckpt", {}, None, 3)
        with pytest.raises(UsageError) as refused:
            continue_in_its_folder(RunConfig(logdir=str(damaged_runs["logs"])), resume)
        release_all()
        message = str(refused.value)
        assert "\n" not in message and message.startswith(str(folder / name)), message
        assert reason.split(": ", 1)[1] in message
        assert written(folder) == before


def written(folder: Path) -> dict[str, int]:
    """Each file of a run and when it last changed (the lock a reader takes aside)."""
    return {p.name: p.stat().st_mtime_ns for p in folder.rglob("*") if p.name != ".run.lock"}


BAD_RECIPES = [
    ("..garbage", "PROJECT_RECIPE=..garbage: not an importable module name"),
    ("no_such_recipe_pkg", "PROJECT_RECIPE=no_such_recipe_pkg: no such module 'no_such_recipe_pkg'"),
    ("json", "PROJECT_RECIPE=json: the package has no RECIPE"),
    ("wrong_type", "PROJECT_RECIPE=wrong_type: its RECIPE is a dict, not a project.contract.Recipe"),
    ("broken_syntax", "PROJECT_RECIPE=broken_syntax: importing it failed: SyntaxError: '(' was never closed ("),
    ("missing_dependency", "PROJECT_RECIPE=missing_dependency: importing it failed: ModuleNotFoundError: No module "
                           "named 'a_dependency_not_installed' ("),
]


@pytest.fixture(scope="module")
def recipe_packages(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recipes")
    for name, text in (("wrong_type", "RECIPE = {'name': 'x'}\n"), ("broken_syntax", "RECIPE = (\n"),
                       ("missing_dependency", "import a_dependency_not_installed\n")):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(text)
    return root


@pytest.mark.parametrize(("package", "message"), BAD_RECIPES)
def test_a_bad_recipe_name_is_one_line_in_every_script(recipe_packages, package, message):
    env = {"PROJECT_RECIPE": package, "PYTHONPATH": f"{recipe_packages}:{ROOT}"}
    for script, *args in (("train.py",), ("runs.py",), ("predict.py", "x.png")):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                              timeout=HANG_S, env={**os.environ, **env})
        assert done.returncode == 2, (script, done.stderr)
        assert message in one_line_error(done.stderr, script), (script, done.stderr)
        if package in ("broken_syntax", "missing_dependency"):
            assert f"{recipe_packages / package / '__init__.py'}:1)" in done.stderr


def test_debug_shows_the_recipes_traceback(recipe_packages):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "runs.py"), "--debug"], capture_output=True,
                          text=True, timeout=HANG_S, env={**os.environ, "PROJECT_RECIPE": "missing_dependency",
                                                       "PYTHONPATH": f"{recipe_packages}:{ROOT}"})
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("runs.py: error: PROJECT_RECIPE=missing_dependency")



def test_a_damaged_checkpoint_is_refused_with_what_is_wrong_with_it(tmp_path):
    """torch.load's own messages for a damaged file are paragraphs, or a bare ``101``: each becomes a reason."""
    import fractions
    import io
    import pickle
    import warnings

    import torch

    from project.errors import CheckpointError
    from project.reliability.checkpointing import read_checkpoint

    def saved(obj: object) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    whole = saved({"state_dict": {"model.w": torch.ones(1000)}, "hyper_parameters": {}})
    corrupt = "corrupt or not a PyTorch file"
    cases = {
        "cut.ckpt": (whole[: len(whole) // 2], f"{corrupt} (damaged or truncated archive)"),
        "notes.ckpt": (b"hello world\n", f"{corrupt} (unreadable pickle data)"),
        "header.ckpt": (b"\x80", f"{corrupt} (unreadable pickle data)"),
        "x.ckpt": (b"x", f"{corrupt} (unreadable pickle data)"),
        "short.ckpt": (b"\x80\x02", f"{corrupt} (it ends too early)"),
        "pickle.ckpt": (pickle.dumps({"a": 1}, protocol=2), f"{corrupt} (Invalid magic number; corrupt file?)"),
        "object.ckpt": (saved({"state_dict": fractions.Fraction(1, 2)}),
                        "holds Python objects, not just tensors; refused for safety (weights_only loading)"),
        "empty.ckpt": (b"", "empty file"),
    }
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        with warnings.catch_warnings(), pytest.raises(CheckpointError) as refused:
            warnings.simplefilter("ignore")
            read_checkpoint(tmp_path / name)
        assert str(refused.value) == f"{tmp_path / name}: {reason}", name


def test_a_file_that_loads_but_is_not_a_checkpoint_or_weights_is_refused_with_what_it_is(tmp_path):
    """A state dict of another model, a list, a dict of numbers: each refused in its own line, never an
    AttributeError from a reader that assumed a dict of tensors."""
    import torch

    from project.errors import CheckpointError
    from project.reliability.checkpointing import data_position, read_checkpoint, read_weights

    def refused(reader, name: str, obj: object) -> str:
        torch.save(obj, tmp_path / name)
        with pytest.raises(CheckpointError) as error:
            reader(tmp_path / name)
        return str(error.value).removeprefix(f"{tmp_path / name}: ")

    not_ours = "not a Lightning checkpoint of this project (no state_dict/hyper_parameters)"
    assert refused(read_checkpoint, "list.ckpt", [torch.ones(2)]) == not_ours
    assert refused(read_checkpoint, "weights.ckpt", {"w": torch.ones(2)}) == not_ours
    assert refused(read_checkpoint, "other.ckpt", {"state_dict": {"net.w": torch.ones(2)}, "hyper_parameters": {}}) \
        == "a Lightning checkpoint, but not of a ClassifierModule (no model.* weights)"
    not_weights = "not an exported model.pth (expected a state_dict: names to tensors)"
    for name, obj in {"list.pth": [torch.ones(2)], "tensor.pth": torch.ones(2), "empty.pth": {},
                      "numbers.pth": {"w": torch.ones(2), "step": 3}}.items():
        assert refused(read_weights, name, obj) == not_weights, name
    position = {"samples_done": 128, "epoch": 1}
    assert data_position({"state_dict": {}, "TinyDataModule": position}) == position
    assert data_position({"state_dict": {}, "callbacks": {}}) is None  # a checkpoint written elsewhere says nothing


@pytest.mark.parametrize(("message", "reason"), [
    ("PytorchStreamReader failed reading zip archive: failed finding central dir", "damaged or truncated archive"),
    ("failed finding central directory of the zip archive", "damaged or truncated archive"),
    ("PytorchStreamReader failed locating file data.pkl: file not found", "damaged or truncated archive"),
    ("", "RuntimeError"),
    ("first line\nsecond line", "first line"),
])
def test_a_damaged_files_reason_is_torchs_message_cut_to_what_a_user_can_act_on(tmp_path, monkeypatch, message, reason):
    import torch

    from project.errors import CheckpointError
    from project.reliability.checkpointing import read_checkpoint

    def failing_load(*args, **kwargs):
        raise RuntimeError(message)

    (tmp_path / "a.ckpt").write_bytes(b"PK\x03\x04 not really")
    monkeypatch.setattr(torch, "load", failing_load)
    with pytest.raises(CheckpointError) as refused:
        read_checkpoint(tmp_path / "a.ckpt")
    assert str(refused.value) == f"{tmp_path / 'a.ckpt'}: corrupt or not a PyTorch file ({reason})"
