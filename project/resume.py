"""``--resume``: the checkpoint to continue from, checked against this run before anything is written."""

from __future__ import annotations

from project.checkpointing import find_checkpoint, read_checkpoint
from project.config import RunConfig
from project.errors import UserError
from project.plan import planned_steps


def checkpoint_to_resume(config: RunConfig, train_size: int | None = None, world_size: int = 1) -> str | None:
    """The checkpoint ``--resume`` names, read now: a corrupt file, another model or a schedule of
    another length is one line before any run folder exists (``train_size``: training images)."""
    if not config.resume:
        return None
    path = find_checkpoint(config.resume, config.logdir, config.name, "--resume")
    checkpoint = read_checkpoint(path)
    saved = checkpoint["hyper_parameters"].get("hidden")
    if saved is not None and list(saved) != list(config.hidden):
        raise UserError(f"the checkpoint has hidden sizes {saved}, this run asks for {config.hidden}; "
                        f"resume with --hidden {','.join(map(str, saved))}")
    saved_world = checkpoint.get("MNISTDataModule", {}).get("world_size")
    if saved_world is not None and saved_world != world_size:
        raise UserError(f"the checkpoint was written by {saved_world} process(es), this run has {world_size}; "
                        "each rank's place in the epoch's data order depends on it: resume with the same "
                        "--devices and --num-nodes")
    schedules = checkpoint.get("lr_schedulers") or [{}]
    total = schedules[0].get("total_steps")
    if total is not None and train_size is not None:
        check_schedule_length(total, planned_steps(config, train_size, world_size))
    return str(path)


def check_schedule_length(saved_total: int, planned: int) -> None:
    """A one-cycle or cosine schedule restored from a checkpoint must span the steps this run takes."""
    if saved_total != planned:
        raise UserError(
            f"the checkpoint's LR schedule spans {saved_total} steps but these settings give {planned}; "
            "resume with the same --max-epochs and --batch-size (or train with --scheduler none)"
        )
