"""DDP on the real torch.distributed engine (gloo on CPU): sharding, metrics, outputs, launchers, failures."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import lightning as L
import pytest
from test_train_script import TINY

from conftest import ROOT, run_script
from project.datamodule import MNISTDataModule
from project.lit_module import LitMNIST

TRAIN = str(ROOT / "scripts" / "train.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def single_process_test_accuracy(checkpoint, data_dir) -> float:
    model = LitMNIST.load_from_checkpoint(checkpoint, weights_only=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    dm = MNISTDataModule(data_dir, batch_size=32, val_size=40)
    return trainer.test(model, datamodule=dm, verbose=False)[0]["test/acc"]


@pytest.mark.slow
def test_two_cpu_processes_write_once_and_match_a_single_process_evaluation(tmp_path):
    from conftest import make_tiny_mnist

    data = make_tiny_mnist(tmp_path / "data", n_train=240, n_test=83)  # 83: not divisible by 2
    logdir = tmp_path / "logs"
    done = run_script("train.py", "--data-dir", str(data), "--logdir", str(logdir), *TINY,
                      "--accelerator", "cpu", "--devices", "2", "--max-epochs", "2", timeout=400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    runs = list((logdir / "mnist").iterdir())
    assert [r.name for r in runs] == ["version_0"]
    run = runs[0]
    writers = {f.name.split(".")[-2] for f in run.glob("events.out.tfevents.*")}  # ...<host>.<pid>.<n>
    assert len(writers) == 1  # only rank 0 writes TensorBoard files
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "last.ckpt"
    assert len(list((run / "checkpoints").iterdir())) == 2
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_batch"] == 64
    assert "global batch 64 = 32 per device x 2 device(s)" in output
    assert output.count("test/acc ") == 1
    single = single_process_test_accuracy(results["best_checkpoint"], data)
    assert results["test/acc"] == pytest.approx(single, abs=1e-6)


@pytest.mark.slow
def test_two_nodes_started_with_torchrun(tiny_mnist, tmp_path):
    port = str(free_port())
    logdir = tmp_path / "logs"
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
         TRAIN, "--num-nodes", "2", "--accelerator", "cpu", "--devices", "1", "--data-dir", str(tiny_mnist),
         "--logdir", str(logdir), *TINY, "--max-epochs", "1"]
        for rank in (0, 1)
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for c in commands]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    assert "world size 2" in outputs[0]
    assert sum(o.count("test/acc ") for o in outputs) == 1
    runs = list((logdir / "mnist").iterdir())
    assert len(runs) == 1 and (runs[0] / "results.json").is_file()
    assert json.loads((runs[0] / "results.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_within_60_seconds(tiny_mnist, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, TRAIN, "--data-dir", str(tiny_mnist), "--logdir", str(tmp_path / "logs"), *TINY,
         "--accelerator", "cpu", "--devices", "2", "--max-epochs", "500", "--scheduler", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    child = None
    deadline = time.monotonic() + 120
    while child is None and time.monotonic() < deadline:  # wait for rank 1 to be training
        time.sleep(1)
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if kids and list((tmp_path / "logs").rglob("last.ckpt")):
            child = int(kids[0])
    assert child is not None, "rank 1 never started"
    os.kill(child, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - killed_at < 60
    assert proc.returncode != 0


INVALID = [
    (["--num-nodes", "2"], "start one copy per machine with torchrun"),
    (["--strategy", "fsdp", "--accelerator", "cpu"], "it needs --accelerator gpu"),
    (["--strategy", "ddp_sharded_maybe"], "is not a Lightning strategy"),
    (["--devices", "2", "--find-lr"], "run on one device"),
]


@pytest.mark.parametrize(("flags", "message"), INVALID)
def test_invalid_distributed_requests_exit_2(tiny_mnist, tmp_path, flags, message):
    done = run_script("train.py", "--data-dir", str(tiny_mnist), "--logdir", str(tmp_path / "logs"),
                      "--accelerator", "cpu", *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_eval_shards_cover_the_split_once():
    from project.datamodule import EvalShardSampler

    shards = [list(EvalShardSampler(range(83), 3, r)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(83))
    assert [len(s) for s in shards] == [len(EvalShardSampler(range(83), 3, r)) for r in range(3)] == [28, 28, 27]
