"""The benchmark script end to end on tiny data: every implementation runs and the report is written."""

import json

import pytest
import torch

from helpers import HANG_S, FakeClock, make_tiny_data, one_line_error, run_script

CNN = {"PROJECT_RECIPE": "tests.cnn_recipe"}



class SlowSamples(torch.utils.data.Dataset):
    """Each sample takes ``delay`` seconds of ``clock`` to read: the known data wait a measurement must find."""

    def __init__(self, count: int, delay: float, clock: FakeClock) -> None:
        self.count, self.delay, self.clock = count, delay, clock

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.clock.advance(self.delay)
        return torch.full((4,), float(index)), index % 2


def test_the_data_wait_of_a_lightning_run_is_the_time_its_batches_took_to_read():
    import lightning as L

    from project.benchmark.loops import DataWait

    clock = FakeClock()

    class Linear(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            clock.advance(0.01)  # the step itself: time that is not waiting
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    wait = DataWait(now=clock)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[wait])
    kept = trainer.profiler
    trainer.fit(Linear(), torch.utils.data.DataLoader(SlowSamples(24, 0.004, clock), batch_size=4))
    # 6 batches of 4 samples of 4 ms each: 96 ms per epoch; the steps' 10 ms are not counted.
    assert wait.epoch_waits == pytest.approx([0.096, 0.096], abs=1e-9)
    assert clock.t == pytest.approx(2 * (0.096 + 0.06), abs=1e-9)
    assert trainer.profiler is kept  # the run's own profiler is back


def test_the_data_wait_of_a_hand_loop_is_the_time_next_blocked():
    from project.benchmark.loops import FetchClock

    time = FakeClock()
    clock = FetchClock(now=time)
    seen = []
    for batch in clock.timed(torch.utils.data.DataLoader(SlowSamples(12, 0.005, time), batch_size=3)):
        seen.append(batch[1].tolist())
        time.advance(0.02)
    assert len(seen) == 4 and clock.seconds == pytest.approx(0.06, abs=1e-9), clock.seconds


@pytest.mark.slow
def test_benchmark_smoke_writes_json_markdown_and_png(tmp_path):
    data = make_tiny_data(tmp_path / "data", n_train=5300, n_test=40)  # 300 left after the 5,000 for validation
    out = tmp_path / "bench"
    done = run_script("benchmark.py", "--epochs", "1", "--limit", "256", "--batch-size", "64", "--time-to-accuracy",
                      "--data-dir", str(data), "--out", str(out), env={"DATA_DIR": str(data)}, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "benchmark.json").read_text())
    assert [r["key"] for r in result["rows"]] == ["hand", "hand-samples", "article", "bare", "template-k1",
                                                  "template-auto", "template-samples"]
    assert all(r["epoch_s"] > 0 and 0 <= r["test_acc"] <= 1 for r in result["rows"])
    assert result["steps_per_epoch"] == 4 and all(r["step_us"] == pytest.approx(r["epoch_s"] / 4 * 1e6)
                                                  for r in result["rows"])
    # Each row is printed as soon as it is measured: every row's line is in the output, in order.
    printed = [line.split(" | ")[0].removeprefix("| ") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert printed[1:] == [r["implementation"] for r in result["rows"]]
    rows = {r["key"]: r for r in result["rows"]}
    assert rows["hand"]["vs_hand"] == 1.0
    assert rows["template-k1"]["steps_per_call"] == 1 and rows["template-auto"]["steps_per_call"] >= 1
    assert result["train_samples"] == 256
    tta = result["time_to_accuracy"]
    assert tta["exit_code"] == 0 and tta["printed_s"] > 0
    assert 0 < tta["project_imports_s"] < tta["train_imports_s"]  # the project's own share of its imports
    markdown = (out / "benchmark.md").read_text()
    assert "| template, steps per call auto |" in markdown and "time to accuracy" in markdown
    assert "of which the project's own modules" in markdown
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vs hand-written" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_benchmark_on_a_missing_gpu_is_one_line_before_any_work(tmp_path):
    done = run_script("benchmark.py", "--accelerator", "gpu", "--epochs", "1", "--out", str(tmp_path / "bench"))
    assert done.returncode == 2
    assert "no CUDA GPU is visible" in one_line_error(done.stderr, "benchmark.py")
    assert not (tmp_path / "bench").exists()


@pytest.mark.slow
def test_the_compute_bound_recipe_against_its_hand_loop(tmp_path):
    """The CNN recipe on its example data, which the benchmark writes: every row on the same samples."""
    done = run_script("benchmark.py", "--example-data", "160", "--limit", "64", "--batch-size", "32", "--epochs", "1",
                      "--only", "hand,template-auto", "--out", str(tmp_path), env=CNN, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "benchmark.json").read_text())
    rows = {r["key"]: r for r in result["rows"]}
    assert list(rows) == ["hand", "template-auto"] and result["recipe"] == "blocks"
    assert result["train_samples"] == 64 and result["steps_per_epoch"] == 2
    assert all(r["epoch_s"] > 0 and 0 <= r["test_acc"] <= 1 for r in rows.values())
    assert rows["template-auto"]["vs_hand"] == pytest.approx(rows["template-auto"]["epoch_s"] / rows["hand"]["epoch_s"])


@pytest.mark.slow
def test_the_compiled_row_counts_compiling_in_its_warm_up_only(tmp_path):
    done = run_script("benchmark.py", "--example-data", "200", "--limit", "128", "--batch-size", "32", "--epochs", "1",
                      "--only", "hand,template-compile", "--out", str(tmp_path), timeout=HANG_S,
                      env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})  # compiled afresh
    assert done.returncode == 0, done.stderr
    compiled = json.loads((tmp_path / "benchmark.json").read_text())["rows"][1]
    assert compiled["key"] == "template-compile" and 0 <= compiled["test_acc"] <= 1
    assert compiled["warm_up_s"] > 2 * compiled["epoch_s"]  # compiling happens in the warm-up epoch
    assert "| template, steps per call auto, --compile |" in done.stdout


def test_example_data_and_a_data_folder_together_are_one_line(tmp_path):
    done = run_script("benchmark.py", "--example-data", "100", "--data-dir", str(tmp_path), "--out",
                      str(tmp_path / "bench"))
    assert done.returncode == 2
    assert "not allowed with argument" in one_line_error(done.stderr, "benchmark.py")
    assert not (tmp_path / "bench").exists()


def test_a_misspelt_row_is_one_line_naming_the_rows_compile_included(tmp_path):
    done = run_script("benchmark.py", "--only", "template-compiled", "--example-data", "40", "--out",
                      str(tmp_path / "bench"), env=CNN)
    assert done.returncode == 2
    message = one_line_error(done.stderr, "benchmark.py")
    assert "error: --only template-compiled: choose from hand, " in message and message.endswith("template-compile")
