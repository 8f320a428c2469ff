"""What a run shows on the terminal: Lightning's known noise filtered out, one owner for the filters."""

from __future__ import annotations

import logging
import warnings

# Harmless for this template: the in-memory loader needs no workers, a small validation
# set gives fewer batches than the logging interval, Lightning's own use of a torch API that
# torch has deprecated is not ours to fix, and with several steps per call a checkpoint is
# meant to hold the state after its step. The test suite applies the same list.
QUIET_WARNINGS = (
    r".*does not have many workers.*",
    r".*is smaller than the logging interval.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Using ModelCheckpoint with manual optimization and every_n_train_steps.*",
    r".*torch\.distributed\.nn\.functional\.all_gather is deprecated.*",  # inside Lightning's all_gather
    # A resumed run continues in its own folder by design (its logs cut back to the checkpoint, its
    # metrics.csv appended to), and the datamodule restores the data order mid-epoch exactly.
    r".*Previous log files in this directory will be deleted.*",
    r".*Checkpoint directory .* exists and is not empty.*",
    r".*your dataloader is not resumable.*",
    # On a SLURM login node a run started without srun is meant to run there (slurm/train.sbatch uses srun).
    r".*The `srun` command is available on your system but is not used.*",
)
# Advertising, the tuner's note on reloading its own temporary checkpoint, and Lightning's note on the
# checkpoint saved when a run stops (the run's own stop message says it in one line).
QUIET_LOG_PREFIXES = ("💡 Tip:", "`weights_only` was not set", "An SIGTERMException was raised",
                      "An KeyboardInterrupt was raised")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(QUIET_LOG_PREFIXES)


def quiet_known_warnings() -> None:
    """Silence, by message, the console noise that says nothing about this template's run."""
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in ("lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_DropAdverts())
    # --compile on a machine without CUDA: inductor says it found no CUDA runtime, which the run knows.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def quiet_lightning_info() -> None:
    """Warnings only from Lightning (a sweep prints one line per trial instead of banners for each)."""
    quiet_known_warnings()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
