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
    assert "error: --only template-compiled: choose from hand, " in message
    assert message.endswith("template-compile, bare-ddp, template-ddp")


def _one_repeat(key: str, step_us: float, steps: int = 10) -> dict:
    return {"epoch_times": [step_us * steps / 1e6], "wait_times": [0.0], "warm_up_s": 1.0, "test_acc": 0.5,
            **({"steps_per_epoch": steps} if key.endswith("-ddp") else {})}


def test_each_repeat_is_measured_against_its_own_references_and_summarised_by_medians_and_ranges():
    from project.benchmark.runner import _add_ratios, _measured_row, _summary

    results = {"steps_per_epoch": 10, "train_samples": 640}
    repeats = []
    for hand, bare, template in [(1000, 2000, 2400), (1500, 2100, 3000), (1000, 1800, 1900)]:
        this: dict = {}
        for key, us in (("hand", hand), ("bare", bare), ("template-k1", template)):
            this[key] = _measured_row(key, _one_repeat(key, us), results, this)
        assert this["hand"]["vs_bare"] is None  # bare Lightning is measured after it
        for row in this.values():  # at the repeat's end, as run_all does
            _add_ratios(row, this)
        repeats.append(this)
    rows = {key: _summary([r[key] for r in repeats]) for key in ("hand", "bare", "template-k1")}
    template = rows["template-k1"]
    # Per repeat: 2.4, 2.0, 1.9 against the hand loop; 1.2, 1.43, 1.06 against bare Lightning.
    assert template["vs_hand"] == pytest.approx(2.0) and template["vs_hand_range"] == pytest.approx([1.9, 2.4])
    assert template["vs_bare"] == pytest.approx(1.2)
    assert template["vs_bare_range"] == pytest.approx([1900 / 1800, 3000 / 2100])
    assert template["step_us"] == pytest.approx(2400) and template["epoch_s"] == pytest.approx(0.024)
    assert [r["step_us"] for r in template["repeats"]] == pytest.approx([2400, 3000, 1900])
    assert rows["hand"]["vs_hand"] == 1.0 and rows["hand"]["vs_hand_range"] == [1.0, 1.0]
    assert rows["bare"]["vs_hand"] == pytest.approx(1.8)  # 2.0, 1.4, 1.8
    assert rows["hand"]["vs_bare_range"] == pytest.approx([1000 / 2000, 1500 / 2100])  # each to its own repeat's
    single = _summary([repeats[0]["template-k1"]])
    assert single is repeats[0]["template-k1"] and "vs_hand_range" not in single  # one run: no range to show


def test_a_ddp_row_is_compared_with_bare_ddp_only_per_step_of_a_rank():
    from project.benchmark.runner import _measured_row

    results = {"steps_per_epoch": 10, "train_samples": 640}
    this: dict = {}
    for key, us in (("hand", 1000), ("bare", 2000), ("bare-ddp", 8000), ("template-ddp", 9000)):
        this[key] = _measured_row(key, _one_repeat(key, us, steps=5 if key.endswith("-ddp") else 10), results, this)
    assert this["template-ddp"]["vs_bare_ddp"] == pytest.approx(9 / 8)
    assert this["template-ddp"]["step_us"] == pytest.approx(9000)  # epoch time over a rank's 5 steps
    assert this["template-ddp"]["vs_hand"] is None and this["template-ddp"]["vs_bare"] is None
    assert this["bare"]["vs_bare_ddp"] is None and this["bare-ddp"]["vs_bare_ddp"] == 1.0


@pytest.mark.slow
def test_repeats_run_the_rows_interleaved_and_report_medians_with_ranges(tmp_path):
    data = make_tiny_data(tmp_path / "data", n_train=5300, n_test=40)
    out = tmp_path / "bench"
    done = run_script("benchmark.py", "--epochs", "1", "--limit", "256", "--repeat", "2", "--only",
                      "template-k1,hand,bare", "--data-dir", str(data), "--out", str(out), timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "benchmark.json").read_text())
    assert result["repeats"] == 2 and [r["key"] for r in result["rows"]] == ["hand", "bare", "template-k1"]
    for row in result["rows"]:
        ratios = [r["vs_hand"] for r in row["repeats"]]
        assert len(ratios) == 2 and row["vs_hand_range"] == [min(ratios), max(ratios)]
        assert row["vs_hand"] == pytest.approx(sum(ratios) / 2)
        assert row["step_us"] == pytest.approx(sum(r["step_us"] for r in row["repeats"]) / 2)
    template = result["rows"][2]
    bare = [r["step_us"] for r in result["rows"][1]["repeats"]]
    assert [r["vs_bare"] for r in result["rows"][0]["repeats"]] == pytest.approx(
        [h["step_us"] / b for h, b in zip(result["rows"][0]["repeats"], bare, strict=True)])
    assert [r["vs_bare"] for r in template["repeats"]] == pytest.approx(
        [t["step_us"] / b for t, b in zip(template["repeats"], bare, strict=True)])
    lines = [line.split(" | ")[0].removeprefix("| ") for line in done.stdout.splitlines() if line.startswith("| ")]
    names = [row["implementation"] for row in result["rows"]]
    assert lines[1:] == ["repeat 1 of 2 |", *names, "repeat 2 of 2 |", *names, "implementation", *names]
    assert "over the 2 repeats:" in done.stdout and "interleaved" in (out / "benchmark.md").read_text()
    assert result["cpu"] and f"(CPU {result['cpu']}, " in (out / "benchmark.md").read_text()
    low, high = template["vs_bare_range"]
    assert f"{template['vs_bare']:.2f}x ({low:.2f}-{high:.2f})" in (out / "benchmark.md").read_text()


@pytest.mark.slow
def test_the_ddp_rows_train_two_processes_and_compare_the_template_with_bare_ddp(tmp_path):
    data = make_tiny_data(tmp_path / "data", n_train=5300, n_test=40)
    out = tmp_path / "bench"
    done = run_script("benchmark.py", "--epochs", "1", "--limit", "256", "--accelerator", "cpu", "--only",
                      "template-ddp,bare-ddp", "--data-dir", str(data), "--out", str(out), timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "benchmark.json").read_text())
    bare, template = result["rows"]
    assert (bare["key"], template["key"]) == ("bare-ddp", "template-ddp")
    assert bare["processes"] == template["processes"] == 2
    assert bare["steps_per_epoch"] == template["steps_per_epoch"] == 2  # 128 samples a rank, batches of 64
    assert template["steps_per_call"] == 1 and all(0 <= r["test_acc"] <= 1 for r in (bare, template))
    assert template["vs_bare_ddp"] == pytest.approx(template["step_us"] / bare["step_us"])
    assert template["step_us"] == pytest.approx(template["epoch_s"] / 2 * 1e6)
    assert template["vs_hand"] is None and "vs bare DDP" in done.stdout


@pytest.mark.slow
def test_a_ddp_row_that_fails_is_one_line_with_the_ranks_own_reason(tmp_path):
    import argparse

    from project.benchmark import ddp
    from project.errors import UserError

    args = argparse.Namespace(data_dir=str(tmp_path / "nowhere"), batch_size=64, accelerator="cpu", precision="32",
                              num_workers=None, val_size=None, limit=None, epochs=1)
    with pytest.raises(UserError) as caught:
        ddp.measure("template-ddp", args, ddp.ROOT)
    message = str(caught.value)
    assert message.startswith("the template-ddp row failed (exit code 1): ") and "nowhere" in message, message
    assert "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize(("ending", "reason"), [
    ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 ended with exit code -9 (SIGKILL)"),
    ("raise SystemExit(3)", "rank 1 ended with exit code 3"),
])
def test_a_ddp_row_whose_rank_dies_without_a_reason_says_which_rank_and_how(tmp_path, ending, reason):
    """A rank killed (or one that exits without an exception) writes no reason of its own: torchrun's report of it
    is a page ending in a rule of '=', and the row's one line is the rank and its exit code from that page."""
    import argparse
    import textwrap

    from project.benchmark import ddp
    from project.errors import UserError

    package = tmp_path / "project" / "benchmark"
    package.mkdir(parents=True)
    for folder in (package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "ddp.py").write_text(textwrap.dedent(f"""\
        import os, signal, time
        if os.environ["RANK"] == "1":
            {ending}
        time.sleep(2)
    """))
    args = argparse.Namespace(epochs=1)
    with pytest.raises(UserError) as caught:
        ddp.measure("bare-ddp", args, tmp_path)
    assert str(caught.value) == f"the bare-ddp row failed (exit code 1): {reason}"


def test_torchruns_page_becomes_the_root_cause_and_the_last_exception_a_rank_printed():
    from project.benchmark.ddp import torchrun_failure

    page = "\n".join([
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "x.py", line 3, in <module>',
        "RuntimeError: an earlier error, not the last",
        "torch.distributed.DistNetworkError: Connection reset by peer",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 55, "x.py FAILED", "-" * 55, "Failures:", "[1]:", "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -15 (pid: 11)  (SIGTERM)", "-" * 55, "Root Cause (first observed failure):", "[0]:",
        "  time      : 2026-12-08_00:44:12", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 12)",
        "  error_file: <N/A>", "=" * 55,
    ])
    assert torchrun_failure(page) == "rank 1 ended with exit code 1: torch.distributed.DistNetworkError: " \
                                     "Connection reset by peer"
    killed = page.replace("  exitcode  : 1 (pid: 12)", "  exitcode  : -9 (pid: 12)  (SIGKILL)")
    before_the_page = killed.index("Traceback (most recent call last):\ntorch.distributed")
    assert torchrun_failure(killed[before_the_page:]) == "rank 1 ended with exit code -9 (SIGKILL)"
    # torchrun failed before any rank ran: its own last words, not its rule of '='
    assert torchrun_failure("RendezvousConnectionError: the store could not start\n" + "=" * 20) == \
        "RendezvousConnectionError: the store could not start"
    assert torchrun_failure("something went wrong\n" + "=" * 20 + "\n") == "something went wrong"
    assert torchrun_failure("\n \n") == "no output"


def test_the_cpu_is_named_as_the_kernel_names_it():
    from pathlib import Path

    from project.benchmark.runner import cpu_name

    info = Path("/proc/cpuinfo")
    named = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    assert cpu_name() == (named[0] if named else cpu_name()) and cpu_name()
