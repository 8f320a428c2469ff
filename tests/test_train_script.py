"""``scripts/train.py`` as a user runs it (a fresh process, real Trainer, real files), and ``train()`` itself."""

import json
import os
import re
import shutil
import subprocess

import pytest
import torch
import yaml

from helpers import HANG_S, ROOT, event_accumulator, summary_value, tiny_config, tiny_recipe, tiny_run, train
from project.errors import UserError
from project.reliability.resume import checkpoint_to_resume

SCALARS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"}


def test_fast_dev_run_exits_zero_and_prints_the_summary_on_stdout(tiny_data, tmp_path):
    done = tiny_run(tiny_data, tmp_path / "logs", "--fast-dev-run")
    assert done.returncode == 0, done.stderr
    assert 0.0 <= float(summary_value(done.stdout, "test/acc")) <= 1.0
    assert "test/acc" not in done.stderr  # results go to stdout, progress to stderr
    assert not (tmp_path / "logs").exists()  # fast_dev_run writes no logs or checkpoints


def test_piped_progress_is_one_plain_line_per_epoch(trained):
    """Not a terminal: no animated bar (no carriage returns), one line per epoch on stderr."""
    assert "\r" not in trained["stderr"] and "\r" not in trained["output"]
    lines = [line for line in trained["stderr"].splitlines() if line.startswith("epoch ")]
    assert [line.split("  ")[:2] for line in lines] == [["epoch 1/2", "step 7"], ["epoch 2/2", "step 14"]]
    for line in lines:
        assert re.fullmatch(r"epoch \d/2  step \d+  train/loss [\d.]+  train/acc [\d.]+  val/loss [\d.]+  "
                            r"val/acc [\d.]+  [\d.]+ s", line), line
    assert "epoch " not in trained["output"]


def test_a_run_writes_scalars_checkpoints_weights_and_real_hparams(trained):
    run, output = trained["run"], trained["output"]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and any(n.startswith("best-") for n in checkpoints)
    assert (run / "model.pth").is_file()
    assert f"tensorboard --logdir {run.parent}  (this run: {run.name})" in output  # named by its folder there
    printed = next(line for line in output.splitlines() if line.startswith("TensorBoard "))
    command = printed.split()[1]  # runs as printed from the project folder in a new shell, no venv activated
    done = subprocess.run([command, "--version_tb"], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert done.returncode == 0 and done.stdout.strip(), (command, done.stderr)

    events = event_accumulator(run)
    tags = set(events.Tags()["scalars"])
    assert SCALARS <= tags, tags
    assert {"train/epoch_time_s", "train/samples_per_s", "train/peak_memory_mb", "val/acc_best"} <= tags
    assert "train/lr" in tags
    assert len(events.Scalars("val/acc")) == 2
    # HPARAMS tab: the run's real metrics (its own curves), not the hp_metric=-1 placeholder
    assert "hp_metric" not in tags
    test_acc = events.Scalars("test/acc")[-1].value
    assert test_acc == pytest.approx(float(summary_value(output, "test/acc")), abs=1e-4)
    hparams_tags = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams_tags
    experiment = hparams_tags["_hparams_/experiment"]
    assert b"test/acc" in experiment and b"val/acc_best" in experiment and b"batch_size" in experiment

    # checkpoints hold plain hyperparameters only: they load under weights_only=True
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1 and state["hyper_parameters"]["hidden"] == [2]


def test_resume_continues_in_its_folder_and_refuses_another_model(trained, tmp_path):
    """More epochs of a finished run without a fixed schedule: the same run goes on, in its own folder."""
    run = tmp_path / "logs" / "tiny" / "version_0"
    shutil.copytree(trained["run"], run)  # the shared run stays as it is
    config = tiny_config(trained["data"], tmp_path / "logs", max_epochs=3, hidden=[2], lr=0.05, scheduler="none",
                         resume=str(run / "checkpoints" / "last.ckpt"))
    result = train(config)
    assert result.run_dir == run and [p.name for p in run.parent.iterdir()] == ["version_0"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 2
    assert [e.step for e in event_accumulator(run).Scalars("val/acc")] == [6, 13, 20]  # two old epochs, one new

    with pytest.raises(UserError, match=r"^--hidden 64: the checkpoint's run trained with --hidden 2, and a resume "
                                        r"continues that run; resume with --hidden 2, or start a new run from its "
                                        r"weights with --init-from "):
        checkpoint_to_resume(config.replace(hidden=[64]), tiny_recipe())
    assert checkpoint_to_resume(config.replace(resume="last"), tiny_recipe()).path == run / "checkpoints" / "last.ckpt"


def test_trainer_pass_through_reaches_the_trainer_and_config_yaml(tiny_data, tmp_path):
    plain = train(tiny_config(tiny_data, tmp_path / "a", max_epochs=1, scheduler="none"))
    accumulated = train(tiny_config(tiny_data, tmp_path / "b", max_epochs=1, scheduler="none",
                                     trainer={"accumulate_grad_batches": 2}))
    steps = [torch.load(r.last_checkpoint, weights_only=True)["global_step"] for r in (plain, accumulated)]
    assert steps == [7, 4]  # 200 samples / 32 = 7 batches; 2 per optimizer step
    saved = yaml.safe_load(accumulated.config_file.read_text())
    assert saved["trainer"] == {"accumulate_grad_batches": 2, "enable_progress_bar": False}
    assert saved["max_epochs"] == 1
    assert json.loads((accumulated.run_dir / "results.json").read_text())["world_size"] == 1


def test_run_version_names_the_folder_and_never_reuses_one(tiny_data, tmp_path):
    from project.errors import UsageError

    config = tiny_config(tiny_data, tmp_path / "logs", max_epochs=1, run_version="baseline")
    result = train(config, test=False)
    assert result.last_checkpoint == str(tmp_path / "logs" / "tiny" / "baseline" / "checkpoints" / "last.ckpt")
    with pytest.raises(UsageError, match="--run-version baseline: .* exists; runs never share a folder"):
        train(config)
