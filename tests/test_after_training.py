"""After training: TensorBoard contents and server, evaluate.py, predict.py, the portable export."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from digit_images import write_transformed_digits
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_train_script import tiny_run

from conftest import run_script
from project.model import build_sequential, hidden_sizes_of

# Two hidden units cannot separate ten classes: mistakes for the worst-mistakes figure to show.
SHORT = ("--max-epochs", "2", "--hidden", "2", "--lr", "0.05", "--scheduler", "none")
SCALARS = {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "lr-SGD",
           "perf/epoch_time_s", "perf/samples_per_s", "perf/peak_memory_mb"}
IMAGES = {"train/first_batch", "val/confusion_matrix", "test/confusion_matrix", "test/worst_misclassified"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import make_tiny_mnist

    root = tmp_path_factory.mktemp("trained")
    data = make_tiny_mnist(root / "data")
    done = tiny_run(data, root / "logs", *SHORT, "--export-pt2", str(root / "model.pt2"))
    assert done.returncode == 0, done.stdout + done.stderr
    run = root / "logs" / "mnist" / "version_0"
    return {"data": data, "logs": root / "logs", "run": run, "output": done.stdout + done.stderr,
            "results": json.loads((run / "results.json").read_text()), "pt2": root / "model.pt2"}


def test_event_files_hold_every_scalar_image_text_and_real_hparams(trained):
    events = EventAccumulator(str(trained["run"]), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert SCALARS <= set(tags["scalars"]), tags["scalars"]
    assert IMAGES <= set(tags["images"]), tags["images"]
    assert len(events.Images("val/confusion_matrix")) == 2  # one per epoch
    assert {"run/command/text_summary", "run/config/text_summary"} <= set(tags["tensors"])
    command = events.Tensors("run/command/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "train.py" in command and "--hidden 2" in command
    hp_acc = events.Scalars("hp/test_acc")[-1].value
    assert 0 < hp_acc <= 1 and hp_acc == pytest.approx(trained["results"]["test/acc"], abs=1e-6)
    assert 0 < events.Scalars("hp/val_acc_best")[-1].value <= 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_tensorboard_serves_the_run(trained):
    port = _free_port()
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

    text = run_script("evaluate.py", *common, "--weights", trained["results"]["weights"])
    assert text.returncode == 0, text.stderr
    assert f"test/acc  {trained['results']['test/acc']:.4f}" in text.stdout
    assert "confusion matrix (rows: true digit, columns: predicted)" in text.stdout

    missing = run_script("evaluate.py", *common, "--weights", str(tmp_path / "nope.pth"))
    assert missing.returncode == 1 and "nope.pth: no such file" in missing.stderr


def test_portable_program_runs_with_torch_alone(trained):
    weights = torch.load(trained["results"]["weights"], weights_only=True)
    article = build_sequential(hidden_sizes_of(weights))
    article.load_state_dict(weights)
    pixels = torch.rand(5, 1, 28, 28)
    expected = article(pixels.reshape(5, -1)).detach()
    torch.save(pixels, trained["run"] / "pixels.pt")
    # -S: no site processing, so no .pth files (an editable install of this project is one);
    # then only the folder torch lives in goes on the path.
    code = (
        f"import sys\nsys.path.append({str(Path(torch.__file__).parents[1])!r})\nimport torch\n"
        "try:\n    import project\n    sys.exit('project code is importable here')\nexcept ImportError:\n    pass\n"
        f"program = torch.export.load({str(trained['pt2'])!r}).module()\n"
        f"out = program(torch.load({str(trained['run'] / 'pixels.pt')!r}))\n"
        f"torch.save(out, {str(trained['run'] / 'out.pt')!r})\n"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(torch.load(trained["run"] / "out.pt"), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_predict_classifies_real_digit_images_and_reports_bad_files(real_data_dir, tmp_path):
    done = run_script("train.py", "--data-dir", str(real_data_dir), "--logdir", str(tmp_path / "logs"),
                      "--max-epochs", "3")
    assert done.returncode == 0, done.stderr
    images = tmp_path / "images"
    labels = write_transformed_digits(real_data_dir, images, count=200)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    (images / "notes.txt").write_text("not a picture")
    predicted = run_script("predict.py", str(images), "--logdir", str(tmp_path / "logs"), "--topk", "2")
    assert predicted.returncode == 1
    errors = predicted.stderr.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("predict.py: ") for e in errors), predicted.stderr
    assert any("broken.png: cannot decode the image" in e or "broken.png: not an image" in e for e in errors)
    assert any("notes.txt: not an image file" in e for e in errors)
    rows = [line.split("\t") for line in predicted.stdout.strip().splitlines()]
    assert len(rows) == 200
    correct = sum(int(row[1]) == labels[Path(row[0]).name] for row in rows)
    print(f"predict.py: {correct}/200 transformed real test digits correct")
    assert correct >= 190
    assert all(0 < float(row[2]) <= 1 and ":" in row[3] for row in rows)  # top-2 column present
