"""After training: TensorBoard contents and server, evaluate.py, predict.py, the portable export."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from helpers import event_accumulator, free_port, run_script, summary_value, write_transformed_digits
from project.recipe.model import build_sequential, hidden_sizes_of

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
        checkpoint_of("best", tmp_path, "mnist", "--ckpt")
    path, run = checkpoint_of("last", trained["logs"], "mnist", "--ckpt")
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
    article = build_sequential(hidden_sizes_of(weights))
    article.load_state_dict(weights)
    pixels = torch.rand(5, 1, 28, 28)
    expected = article(pixels.reshape(5, -1)).detach()
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


@pytest.mark.slow
def test_predict_classifies_real_digit_images_and_reports_bad_files(default_run, real_data_dir, tmp_path):
    images = tmp_path / "images"
    labels = write_transformed_digits(real_data_dir, images, count=200)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    (images / "notes.txt").write_text("not a picture")
    predicted = run_script("predict.py", str(images), "--weights", summary_value(default_run["output"], "weights"),
                           "--topk", "2")
    assert predicted.returncode == 1
    using, *errors = predicted.stderr.strip().splitlines()
    assert using == f"predict.py: using {summary_value(default_run['output'], 'weights')}"  # which model, said
    assert len(errors) == 2 and all(e.startswith("predict.py: ") for e in errors), predicted.stderr
    assert any("broken.png: cannot decode the image" in e or "broken.png: not an image" in e for e in errors)
    assert any("notes.txt: not an image file" in e for e in errors)
    rows = [line.split("\t") for line in predicted.stdout.strip().splitlines()]
    assert len(rows) == 200
    correct = sum(int(row[1]) == labels[Path(row[0]).name] for row in rows)
    print(f"predict.py: {correct}/200 transformed real test digits correct")
    assert correct >= 190
    assert all(0 < float(row[2]) <= 1 and ":" in row[3] for row in rows)  # top-2 column present


def test_the_confusion_image_writes_each_count_and_labels_the_classes():
    from project.results.figures import confusion_image

    def ink(matrix: torch.Tensor) -> int:  # near-black pixels: text (counts, labels, title)
        return int((confusion_image(matrix, "test set").max(dim=0).values < 0.3).sum())

    diagonal = torch.eye(4, dtype=torch.long) * 10
    assert ink(diagonal + 3) > ink(diagonal) + 12 * 4  # twelve more counts, each several dark pixels
    assert ink(torch.eye(10, dtype=torch.long)) > ink(torch.eye(4, dtype=torch.long))  # labels for 10 classes
    assert confusion_image(torch.eye(10, dtype=torch.long), "t").shape[1:] > confusion_image(
        torch.eye(4, dtype=torch.long), "t").shape[1:]
