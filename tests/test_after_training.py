"""After training: TensorBoard contents and server, evaluate.py, predict.py, the portable export."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from helpers import event_accumulator, free_port, run_script
from tests.tiny_recipe.model import LitTiny

SCALARS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "train/lr",
           "train/epoch_time_s", "train/samples_per_s", "train/peak_memory_mb"}
IMAGES = {"train/first_batch", "val/confusion_matrix", "test/confusion_matrix", "test/worst_misclassified"}


def test_event_files_hold_every_scalar_image_text_and_real_hparams(trained):
    events = event_accumulator(trained["run"])
    tags = events.Tags()
    assert SCALARS <= set(tags["scalars"]), tags["scalars"]
    assert IMAGES <= set(tags["images"]), tags["images"]
    assert len(events.Images("val/confusion_matrix")) == 2  # one per epoch
    assert {"run/command/text_summary", "run/config/text_summary"} <= set(tags["tensors"])
    command = events.Tensors("run/command/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "train.py" in command and "--hidden 2" in command
    # The HPARAMS tab reads the run's own curves: no extra points at step 0, no "epoch" curve.
    assert not any(tag.startswith("hp/") or tag == "epoch" for tag in tags["scalars"]), tags["scalars"]
    assert events.Scalars("test/acc")[-1].value == pytest.approx(trained["results"]["test/acc"], abs=1e-6)
    experiment = events.PluginTagToContent("hparams")["_hparams_/experiment"]
    assert b"val/acc_best" in experiment and b"test/acc" in experiment
    assert all(name.encode() in experiment for name in ("lr", "momentum", "scheduler", "seed", "hidden", "val_size",
                                                         "steps_per_call", "cuda_graphs"))


@pytest.mark.slow
def test_tensorboard_serves_the_run(trained):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(trained["run"]), "--host", "127.0.0.1",
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, tags = time.monotonic() + 90, {}
        while time.monotonic() < deadline and not SCALARS <= set(tags.get(".", {})):
            time.sleep(1)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as reply:
                    tags = json.load(reply)
            except OSError:
                continue
        assert SCALARS <= set(tags.get(".", {})), tags
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_evaluate_agrees_with_training(trained, tmp_path):
    common = ("--data-dir", str(trained["data"]), "--logdir", str(trained["logs"]))
    done = run_script("evaluate.py", *common, "--ckpt", "best", "--json", "--plot", str(tmp_path / "cm.png"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["test/acc"] == pytest.approx(trained["results"]["test/acc"], abs=1e-7)
    assert result["source"] == trained["results"]["best_checkpoint"]
    assert sum(map(sum, result["confusion_matrix"])) == result["samples"] == 80
    assert len(result["per_class_acc"]) == 10
    assert (tmp_path / "cm.png").stat().st_size > 5000

    from project.results.evaluation import evaluate_test_set, load_classifier, render

    text = render(evaluate_test_set(load_classifier(weights=trained["results"]["weights"]), str(trained["data"])))
    assert f"test/acc  {trained['results']['test/acc']:.4f}" in text
    assert "confusion matrix (rows: true class, columns: predicted)" in text


def test_evaluate_names_what_is_missing(trained, tmp_path):
    from project.errors import CheckpointError, UsageError
    from project.reliability.runs import checkpoint_of
    from project.results.evaluation import load_classifier

    with pytest.raises(CheckpointError, match="nope.pth: no such file"):
        load_classifier(weights=str(tmp_path / "nope.pth"))
    with pytest.raises(UsageError, match="--ckpt best: no run with a best checkpoint under"):
        checkpoint_of("best", tmp_path, "tiny", "--ckpt")
    path, run = checkpoint_of("last", trained["logs"], "tiny", "--ckpt")
    assert path == trained["run"] / "checkpoints" / "last.ckpt" and run.folder == trained["run"]


def test_plot_scalars_draws_the_run(trained, tmp_path):
    done = run_script("plot_scalars.py", str(trained["run"]), "--out", str(tmp_path / "s.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from project.errors import UserError
    from project.results.figures import scalars_figure

    with pytest.raises(UserError, match="none of the tags no/such"):
        scalars_figure(str(trained["run"]), ["no/such"])


def test_portable_program_runs_with_torch_alone(trained):
    weights = torch.load(trained["results"]["weights"], weights_only=True)
    network = LitTiny.network_from_weights(weights, "model.pth")  # the recipe's MLP: normalised inputs, as trained
    pixels = torch.rand(5, 1, 28, 28)
    expected = network(pixels).detach()
    folder = trained["pt2"].parent
    torch.save(pixels, folder / "pixels.pt")
    # -S: no site processing, so no .pth files (an editable install of this project is one);
    # then only the folder torch lives in goes on the path.
    code = (
        f"import sys\nsys.path.append({str(Path(torch.__file__).parents[1])!r})\nimport torch\n"
        "try:\n    import project\n    sys.exit('project code is importable here')\nexcept ImportError:\n    pass\n"
        f"program = torch.export.load({str(trained['pt2'])!r}).module()\n"
        f"out = program(torch.load({str(folder / 'pixels.pt')!r}))\n"
        f"torch.save(out, {str(folder / 'out.pt')!r})\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(torch.load(folder / "out.pt"), expected, atol=1e-5, rtol=1e-5)
    assert f"portable program {trained['pt2']}" in trained["output"]


def test_the_confusion_image_writes_each_count_and_labels_the_classes():
    from project.results.figures import confusion_image

    def ink(matrix: torch.Tensor) -> int:  # near-black pixels: text (counts, labels, title)
        return int((confusion_image(matrix, "test set").max(dim=0).values < 0.3).sum())

    diagonal = torch.eye(4, dtype=torch.long) * 10
    assert ink(diagonal + 3) > ink(diagonal) + 12 * 4  # twelve more counts, each several dark pixels
    assert ink(torch.eye(10, dtype=torch.long)) > ink(torch.eye(4, dtype=torch.long))  # labels for 10 classes
    assert confusion_image(torch.eye(10, dtype=torch.long), "t").shape[1:] > confusion_image(
        torch.eye(4, dtype=torch.long), "t").shape[1:]


def test_worst_mistakes_work_with_any_shard_size():
    from project.results.tensorboard_figures import WorstMistakes

    class OneProcess:  # what compute() needs of a LightningModule
        device = torch.device("cpu")
        trainer = type("T", (), {"world_size": 1})()

    worst = WorstMistakes(k=32)
    worst.input_shape, worst.num_classes = (1, 28, 28), 10
    none_seen = worst.compute(OneProcess())
    assert len(none_seen["inputs"]) == 0  # a rank with no test images at all
    images = torch.zeros(5, 1, 28, 28)
    targets = torch.tensor([0, 1, 2, 3, 4])
    log_probs = torch.log_softmax(torch.eye(10)[[0, 1, 2, 3, 9]] * 5, dim=1)  # only the last one is wrong
    worst.update(images, log_probs, targets)
    found = worst.compute(OneProcess())
    assert found["true"].tolist() == [4] and found["predicted"].tolist() == [9]  # fewer than k, none padded in
    worst.reset()
    worst.update(images[:4], log_probs[:4], targets[:4])
    assert len(worst.compute(OneProcess())["inputs"]) == 0  # none wrong
