"""After training: TensorBoard contents and server, evaluate.py, predict.py, the portable export."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from helpers import HANG_S, ROOT, event_accumulator, free_port, run_script, tiny_config, tiny_recipe, train
from project.errors import UsageError
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
    model = events.Tensors("run/model/text_summary")[0].tensor_proto.string_val[0].decode()
    weights = torch.load(trained["run"] / "checkpoints" / "last.ckpt", map_location="cpu",
                         weights_only=True)["state_dict"]
    count = sum(tensor.numel() for key, tensor in weights.items() if key.startswith("model."))
    assert model.startswith(f"{count:,} trainable parameters ({count:,} in all)\n\n    "), model
    assert "Linear" in model
    # Histograms and the graph are asked for (--log-histograms, --log-graph): not in a default run.
    assert not tags["histograms"] and not tags["graph"]
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
        deadline, tags = time.monotonic() + HANG_S, {}
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

    classifier = load_classifier(tiny_recipe(), weights=trained["results"]["weights"])
    text = render(evaluate_test_set(tiny_recipe(), classifier, str(trained["data"])))
    assert f"test/acc  {trained['results']['test/acc']:.4f}" in text
    assert "confusion matrix (rows: true class, columns: predicted)" in text


@pytest.mark.slow
def test_a_run_records_its_data_and_evaluate_uses_it_in_a_new_shell(shared_tiny_data, tmp_path):
    """Trained with DATA_DIR set (no --data-dir), then evaluated from another folder in a shell without it."""
    import os

    import yaml

    from helpers import TINY

    logs = tmp_path / "logs"
    trained = run_script("train.py", "--logdir", str(logs), *TINY, "--max-epochs", "1",
                         env={"DATA_DIR": str(shared_tiny_data)})
    assert trained.returncode == 0, trained.stderr
    run = logs / "tiny" / "version_0"
    assert yaml.safe_load((run / "config.yaml").read_text())["data_dir"] == str(shared_tiny_data.resolve())
    new_shell = {key: value for key, value in os.environ.items() if key != "DATA_DIR"}
    elsewhere = {**new_shell, "DATA_DIR": str(tmp_path / "another-recipes-data")}  # exported for something else
    for source, shell in ((("--ckpt", "best"), new_shell), (("--weights", str(run / "model.pth")), new_shell),
                          (("--ckpt", "best"), elsewhere)):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--logdir", str(logs), *source,
                               "--json"], capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path, env=shell)
        assert done.returncode == 0, done.stderr
        assert f"evaluate.py: test set from {shared_tiny_data.resolve()}, the data its run trained on" in done.stderr
        assert json.loads(done.stdout)["samples"] == 80


def test_evaluate_names_what_is_missing(trained, tmp_path):
    from project.errors import CheckpointError, UsageError
    from project.reliability.run_folder import checkpoint_of
    from project.results.evaluation import load_classifier

    with pytest.raises(CheckpointError, match="nope.pth: no such file"):
        load_classifier(tiny_recipe(), weights=str(tmp_path / "nope.pth"))
    with pytest.raises(UsageError, match="--ckpt best: no run with a best checkpoint under"):
        checkpoint_of("best", tmp_path, "tiny", "--ckpt")
    path, run = checkpoint_of("last", trained["logs"], "tiny", "--ckpt")
    assert path == trained["run"] / "checkpoints" / "last.ckpt" and run.folder == trained["run"]


def test_plot_scalars_draws_the_run(trained, tmp_path):
    done = run_script("plot_scalars.py", str(trained["run"]), "--out", str(tmp_path / "s.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from project.errors import UserError
    from project.results.plots import scalars_figure

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
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=HANG_S,
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
    from project.results.figures import WorstMistakes

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


def test_the_confusion_figure_shows_each_count_over_its_rows_share():
    from project.results.plots import confusion_figure

    counts = torch.tensor([[5, 0, 1], [2, 7, 0], [0, 0, 0]])
    ax = confusion_figure(counts, "test set, accuracy 0.8").axes[0]
    shares = ax.images[0].get_array()
    expected = [[5 / 6, 0, 1 / 6], [2 / 9, 7 / 9, 0], [0, 0, 0]]  # a class never seen: an empty row, not NaN
    assert torch.allclose(torch.tensor(shares.tolist(), dtype=torch.float64),
                          torch.tensor(expected, dtype=torch.float64))
    written = {(round(t.get_position()[1]), round(t.get_position()[0])): (t.get_text(), t.get_color())
               for t in ax.texts}
    assert written == {(0, 0): ("5", "white"), (0, 2): ("1", "black"), (1, 0): ("2", "black"),
                       (1, 1): ("7", "white")}
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("test set, accuracy 0.8", "predicted", "true")
    assert list(ax.get_xticks()) == list(ax.get_yticks()) == [0, 1, 2]


def test_scalars_figure_draws_each_wanted_tag_that_the_run_holds_in_the_order_asked(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from project.errors import UserError
    from project.results.plots import scalars_figure

    with SummaryWriter(tmp_path) as writer:
        for step in range(25):
            writer.add_scalar("val/acc", step / 25, step)
        for step in (0, 10, 20):
            writer.add_scalar("train/loss", 2.0 - step / 10, step)
    axes = scalars_figure(str(tmp_path), ["val/acc", "test/acc", "train/loss"]).axes
    assert [ax.get_title() for ax in axes] == ["val/acc", "train/loss"]
    (many,), (few,) = axes[0].lines, axes[1].lines
    assert list(few.get_xdata()) == [0, 10, 20] and list(few.get_ydata()) == pytest.approx([2.0, 1.0, 0.0])
    assert few.get_marker() == "o" and many.get_marker() == "None"  # markers only where points are few
    assert list(many.get_xdata()) == list(range(25))
    four = scalars_figure(str(tmp_path), ["val/acc", "train/loss", "val/acc", "train/loss"]).axes
    assert len(four) == 6 and [ax.axison for ax in four] == [True] * 4 + [False] * 2  # 3 columns, 2 rows
    with pytest.raises(UserError, match=r": none of the tags test/acc,x are in its event files$"):
        scalars_figure(str(tmp_path), ["test/acc", "x"])
    with pytest.raises(UserError, match=r": not a run folder \(no TensorBoard event files in it\)$"):
        scalars_figure(str(tmp_path / "missing"), ["val/acc"])


def test_the_program_is_written_whole_and_computes_what_the_network_does(tmp_path):
    from torch import nn

    from project.errors import UsageError
    from project.results.export import save_program

    torch.manual_seed(0)
    network = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3)).eval()
    path = save_program(network, (3, 2, 2), tmp_path / "out" / "deeper" / "model.pt2")  # folders made as needed
    assert path == tmp_path / "out" / "deeper" / "model.pt2" and [p.name for p in path.parent.iterdir()] == [
        "model.pt2"]
    assert save_program(network, (3, 2, 2), path.with_name("again.pt2")).exists()  # into a folder that exists
    path.with_name("again.pt2").unlink()
    program = torch.export.load(path).module()
    for batch in (1, 7):  # any batch size, not only the example's
        inputs = torch.rand(batch, 3, 2, 2)
        torch.testing.assert_close(program(inputs), network(inputs))

    class Branching(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x  # data-dependent control flow: torch.export refuses it

    with pytest.raises(UsageError, match=r"^--export-pt2: torch.export cannot export Branching \(.+\); drop "
                                         r"--export-pt2 or make the network exportable$"):
        save_program(Branching(), (3,), tmp_path / "b.pt2")
    assert not (tmp_path / "b.pt2").exists()

    class Refusing(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("this network cannot be traced\nbecause of its second line")

    with pytest.raises(UsageError, match=r"cannot export Refusing \(this network cannot be traced\); drop"):
        save_program(Refusing(), (3,), tmp_path / "r.pt2")  # torch's reason, its first line


def test_each_file_gets_the_networks_top_classes_or_its_reason(tmp_path):
    from PIL import Image
    from torch import nn

    from project.errors import one_field
    from project.results.evaluation import Classifier
    from project.results.prediction import classify_files, render_row
    from tests.tiny_recipe.data import TinyDataModule

    torch.manual_seed(0)
    network = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    pixels = (torch.rand(2, 28, 28) * 100).to(torch.uint8)  # light strokes on dark, as the recipe's images
    for index, image in enumerate(pixels):
        Image.fromarray(image.numpy(), "L").save(tmp_path / f"{index}.png")
    (tmp_path / "0b-notes.txt").write_text("not an image")  # between the two images: the second is still read
    results = dict(classify_files(tiny_recipe(), Classifier(network, "net"), [str(tmp_path)], topk=3))
    assert list(results) == [tmp_path / "0.png", tmp_path / "0b-notes.txt", tmp_path / "1.png"]
    mean, std = TinyDataModule.mean[0], TinyDataModule.std[0]
    for index, image in enumerate(pixels):
        expected = torch.softmax(network(((image.float() / 255 - mean) / std)[None, None].float()), dim=1)[0]
        top = expected.topk(3)
        result = results[tmp_path / f"{index}.png"]
        assert [c for c, _ in result["topk"]] == top.indices.tolist() and result["class"] == int(top.indices[0])
        assert [p for _, p in result["topk"]] == pytest.approx(top.values.tolist(), abs=1e-5)
        assert result["probability"] == result["topk"][0][1] and result["path"] == str(tmp_path / f"{index}.png")
        assert render_row(result).split("\t") == [str(tmp_path / f"{index}.png"), str(result["class"]),
                                                  f"{result['probability']:.4f}",
                                                  *(f"{c}:{p:.4f}" for c, p in result["topk"][1:])]
    assert isinstance(results[tmp_path / "0b-notes.txt"], str) and "image" in results[tmp_path / "0b-notes.txt"]
    assert one_field("a\\b\tc\nd\re") == r"a\\b\tc\nd\re"  # one row of fields, whatever the file is called
    assert len(dict(classify_files(tiny_recipe(), Classifier(network, "net"), [str(tmp_path / "0.png")], topk=20))[
        tmp_path / "0.png"]["topk"]) == 10  # no more classes than there are
    [(_, alone)] = classify_files(tiny_recipe(), Classifier(network, "net"), [str(tmp_path / "1.png")])
    assert len(alone["topk"]) == 1  # the top class only, unless asked


def test_a_colour_image_is_classified_as_one_image_of_three_channels(tmp_path):
    from PIL import Image

    from project.contract import load_recipe
    from project.results.prediction import classify_files

    Image.new("RGB", (16, 16), (200, 30, 90)).save(tmp_path / "red.png")
    shapes = []

    def classifier(batch: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(batch.shape))
        return torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0]] * len(batch)), dim=1)

    [(_, result)] = classify_files(load_recipe("tests.disk_recipe"), classifier, [str(tmp_path / "red.png")])
    assert shapes == [(1, 3, 16, 16)] and result["class"] == 1


def test_evaluates_table_lays_out_each_class_and_the_confusion_matrix():
    from project.results.evaluation import render

    results = {"source": "model.pth", "samples": 12, "test/acc": 0.75, "test/loss": 0.61234, "classes": ["0", "1", "2"],
               "per_class_acc": [1.0, 0.5, 0.75], "confusion_matrix": [[4, 0, 0], [1, 2, 1], [0, 1, 3]]}
    assert render(results).split("\n") == [
        "model     model.pth",
        "test set  12 samples",
        "test/acc  0.7500",
        "test/loss 0.6123",
        "",
        "per-class accuracy",
        "      0      1      2",
        "  1.000  0.500  0.750",
        "",
        "confusion matrix (rows: true class, columns: predicted)",
        "true      0     1     2",
        "   0      4     0     0",
        "   1      1     2     1",
        "   2      0     1     3",
    ]
    named = {**results, "classes": ["cat", "zebra\x1b", "ox"]}  # a recipe's class_names, printed terminal-safe
    assert render(named).split("\n")[5:] == [
        "per-class accuracy",
        "        cat  zebra\\x1b         ox",
        "      1.000      0.500      0.750",
        "",
        "confusion matrix (rows: true class, columns: predicted)",
        "true             cat zebra\\x1b        ox",
        "      cat          4         0         0",
        "zebra\\x1b          1         2         1",
        "       ox          0         1         3",
    ]


@pytest.mark.parametrize("every", [1, 2])
def test_histograms_every_n_epochs_and_the_graph_on_request_change_no_training(shared_tiny_data, tmp_path, every):
    plain = train(tiny_config(shared_tiny_data, tmp_path / "plain", max_epochs=3), test=False)
    shown = train(tiny_config(shared_tiny_data, tmp_path / "shown", max_epochs=3, log_histograms=every,
                              log_graph=True), test=False)
    events = event_accumulator(shown.run_dir)
    last = torch.load(shown.last_checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    names = [key.removeprefix("model.") for key in last if key.startswith("model.")]
    tags = events.Tags()
    assert sorted(tags["histograms"]) == sorted([f"weights/{n}" for n in names] + [f"gradients/{n}" for n in names])
    steps_per_epoch = shown.optimizer_steps // 3
    logged_at = [event.step for event in events.Histograms(f"weights/{names[0]}")]
    assert logged_at == [steps_per_epoch * epoch for epoch in range(1, 4) if epoch % every == 0]
    if every == 1:  # the last epoch's histogram is of the weights the run ended with
        histogram = events.Histograms(f"weights/{names[0]}")[-1].histogram_value
        assert histogram.num == last[f"model.{names[0]}"].numel()
        assert histogram.sum == pytest.approx(float(last[f"model.{names[0]}"].sum()), rel=1e-5, abs=1e-5)
    assert tags["graph"]
    before = torch.load(plain.last_checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(before[key], last[key]) for key in before)  # what is logged changes nothing trained


def test_histograms_and_the_graph_need_tensorboard(shared_tiny_data, tmp_path):
    with pytest.raises(UsageError, match=r"--log-histograms writes to TensorBoard: add it to the loggers "
                                         r"\(--logger csv,tensorboard\)"):
        tiny_config(shared_tiny_data, tmp_path, logger="csv", log_histograms=1)
    with pytest.raises(UsageError, match="--log-graph writes to TensorBoard"):
        tiny_config(shared_tiny_data, tmp_path, logger="csv", log_graph=True)


def test_a_run_records_its_recipe_and_data_and_its_config_is_refused_by_another_recipe(trained, capsys):
    from helpers import parse_run_command_of
    from project.contract import load_recipe

    record = json.loads((trained["run"] / "run.json").read_text())
    assert record["recipe"] == "tests.tiny_recipe" and record["data_dir"] == str(trained["data"].resolve())
    saved = (trained["run"] / "config.yaml").read_text()
    assert saved.startswith("recipe: tests.tiny_recipe\n") and f"data_dir: {trained['data'].resolve()}\n" in saved
    config_file = str(trained["run"] / "config.yaml")
    assert parse_run_command_of(tiny_recipe(), ["--config", config_file]).data_dir == str(trained["data"].resolve())
    with pytest.raises(SystemExit) as refused:
        parse_run_command_of(load_recipe("tests.second_recipe"), ["--config", config_file])
    assert refused.value.code == 2
    assert capsys.readouterr().err.endswith(f"--config {config_file}: made for recipe 'tests.tiny_recipe', and the "
                                            "recipe here is tests.second_recipe: run it with "
                                            "PROJECT_RECIPE=tests.tiny_recipe\n")


class AlwaysColumn(torch.nn.Module):
    """A classifier that says "column" (class 1) of every image, whatever it is."""

    source = "a classifier that always says column"

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        assert batch.shape[1:] == (3, 16, 16)  # read as the recipe reads an image
        return torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0]] * len(batch)), dim=1)


def test_evaluate_images_measures_a_folder_of_class_folders_each_named_as_its_class(tmp_path):
    from PIL import Image

    from project.contract import load_recipe
    from project.errors import UsageError
    from project.results.evaluation import evaluate_folder

    recipe = load_recipe("tests.disk_recipe")
    for name, count in (("bar", 2), ("column", 1), ("square", 1)):
        (tmp_path / "held" / name).mkdir(parents=True)
        for index in range(count):
            Image.new("RGB", (20, 12), (40 * index, 90, 200)).save(tmp_path / "held" / name / f"{index}.png")
    (tmp_path / "held" / "square" / "notes.txt").write_text("not an image")
    (tmp_path / "held" / ".thumbnails").mkdir()  # hidden: not a class
    results, failures = evaluate_folder(recipe, AlwaysColumn(), tmp_path / "held")
    assert results["classes"] == ["bar", "column", "square"] and results["samples"] == 4
    assert results["confusion_matrix"] == [[0, 2, 0], [0, 1, 0], [0, 1, 0]] and results["test/acc"] == 0.25
    assert [path.name for path, _ in failures] == ["notes.txt"]
    (tmp_path / "held" / "zebra").mkdir()
    with pytest.raises(UsageError, match=r"^--images .*/held: 'zebra' is not one of the recipe's classes \(its "
                                         r"classes: bar, column, square\); name each folder as its class$"):
        evaluate_folder(recipe, AlwaysColumn(), tmp_path / "held")
    with pytest.raises(UsageError, match=r"^--images .*/nowhere: no such folder$"):
        evaluate_folder(recipe, AlwaysColumn(), tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"^--images .*/empty: no class folders in it \(its classes: bar, column, "
                                         r"square\); name each folder as its class$"):
        evaluate_folder(recipe, AlwaysColumn(), tmp_path / "empty")
    (tmp_path / "unreadable" / "bar").mkdir(parents=True)
    (tmp_path / "unreadable" / "bar" / "notes.txt").write_text("not an image")
    with pytest.raises(UsageError, match=r"^--images .*/unreadable: none of its files could be read as an image$"):
        evaluate_folder(recipe, AlwaysColumn(), tmp_path / "unreadable")
