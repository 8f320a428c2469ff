"""The benchmark script end to end on tiny data: every implementation runs and the report is written."""

import json

import pytest
import torch

from helpers import make_tiny_data, one_line_error, run_script


@pytest.mark.slow
def test_benchmark_smoke_writes_json_markdown_and_png(tmp_path):
    data = make_tiny_data(tmp_path / "data", n_train=5300, n_test=40)  # 300 left after the 5,000 for validation
    out = tmp_path / "bench"
    done = run_script("benchmark.py", "--epochs", "1", "--limit", "256", "--batch-size", "64", "--time-to-accuracy",
                      "--data-dir", str(data), "--out", str(out), env={"DATA_DIR": str(data)}, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "benchmark.json").read_text())
    assert [r["key"] for r in result["rows"]] == ["hand", "article", "bare", "template-k1", "template-auto",
                                                  "template-samples"]
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
    assert result["time_to_accuracy"]["exit_code"] == 0 and result["time_to_accuracy"]["printed_s"] > 0
    markdown = (out / "benchmark.md").read_text()
    assert "| template, steps per call auto |" in markdown and "time to accuracy" in markdown
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vs hand-written" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_benchmark_on_a_missing_gpu_is_one_line_before_any_work(tmp_path):
    done = run_script("benchmark.py", "--accelerator", "gpu", "--epochs", "1", "--out", str(tmp_path / "bench"))
    assert done.returncode == 2
    assert "no CUDA GPU is visible" in one_line_error(done.stderr, "benchmark.py")
    assert not (tmp_path / "bench").exists()
