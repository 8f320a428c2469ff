"""``scripts/train.py`` with one fault injected: rank FAIL_RANK runs out of memory at step FAIL_STEP.

DDP re-runs this script for every rank, so the fault callback is in each process and only the
chosen rank fires it. Started by tests/test_faults.py.
"""

import os
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.cli import parse_run_config  # noqa: E402
from project.errors import run_cli  # noqa: E402
from project.run import train  # noqa: E402


class FailAt(L.Callback):
    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step >= self.step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected on rank {self.rank} at step "
                                         f"{trainer.global_step})")


def main() -> int:
    config = parse_run_config()
    fault = FailAt(int(os.environ["FAIL_RANK"]), int(os.environ["FAIL_STEP"]))
    run_cli(lambda: train(config, callbacks=[fault]) and 0, "train.py", debug=config.debug)
    return 0


if __name__ == "__main__":
    main()
