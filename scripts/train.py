#!/usr/bin/env python
"""Train the MNIST MLP, test its best checkpoint, export ``model.pth`` and print a summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.cli import parse_args  # noqa: E402  (light: argparse only)
from project.errors import run_cli  # noqa: E402


def main() -> int:
    started = time.perf_counter()
    args = parse_args()

    import lightning as L
    from lightning.pytorch.utilities import rank_zero_info

    from project import training
    from project.callbacks import peak_memory_mb, release_cuda_cache
    from project.checkpointing import read_checkpoint
    from project.devices import resolve_precision, validate_hardware

    training.quiet_known_warnings()
    validate_hardware(args)
    L.seed_everything(args.seed, workers=True, verbose=False)
    precision = resolve_precision(args.precision, args.accelerator)
    training.check_outputs_writable(args)
    ckpt_path = training.find_last_checkpoint(args.logdir, args.name) if args.resume == "last" else args.resume
    if ckpt_path:
        read_checkpoint(ckpt_path)  # a corrupt or foreign file is reported in one line, now

    datamodule = training.build_datamodule(args)
    datamodule.prepare_data()  # a missing dataset is reported before any process starts
    model = training.build_model(args)
    trainer = training.build_trainer(args, precision)
    training.log_run_text(trainer, args, precision)
    training.tune(trainer, model, datamodule, args)
    config = training.save_config(trainer, args, model, datamodule)

    with training.reported_failures():
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        release_cuda_cache()
        # Read before test(): restoring the best checkpoint also restores the callbacks' old state.
        best, last, best_val = training.checkpoint_paths(trainer)
        test_metrics = trainer.test(model, datamodule=datamodule, ckpt_path=best, verbose=False)[0]
        release_cuda_cache()
    if not trainer.is_global_zero:
        return 0

    global_batch = datamodule.batch_size * trainer.num_devices * trainer.num_nodes
    device = trainer.strategy.root_device
    memory_kind = "max allocated on " + str(device) if device.type == "cuda" else "peak resident set"
    lines = [
        f"test/acc {test_metrics['test/acc']:.4f}   test/loss {test_metrics['test/loss']:.4f}",
        f"global batch {global_batch} = {datamodule.batch_size} per device x {trainer.num_devices} device(s)"
        f" x {trainer.num_nodes} node(s); world size {trainer.world_size}; precision {precision};"
        f" lr {model.hparams.lr:g}",
        f"peak memory {peak_memory_mb(device):.0f} MiB ({memory_kind})",
    ]
    if not args.fast_dev_run:
        run_dir = training.run_dir(trainer)
        weights = training.save_weights(model.model, args.export or run_dir / "model.pth")
        if args.export_pt2:
            lines.append(f"portable program {training.save_program(model.model, args.export_pt2)}"
                         "  (torch.export.load(path).module(); ToTensor() pixels in)")
        training.log_hparams_with_results(
            trainer,
            {**model.hparams, "batch_size": datamodule.batch_size, "global_batch": global_batch,
             "max_epochs": args.max_epochs, "precision": precision, "seed": args.seed,
             "loader": args.loader, "world_size": trainer.world_size},
            {"hp/val_acc_best": best_val, "hp/test_acc": test_metrics["test/acc"]},
        )
        training.write_results(run_dir / "results.json", {
            **test_metrics, "val/acc_best": best_val, "best_checkpoint": best, "last_checkpoint": last,
            "weights": str(weights), "global_batch": global_batch, "world_size": trainer.world_size,
            "precision": precision, "lr": model.hparams.lr,
        })
        lines += [
            f"best checkpoint  {best}  (val/acc {best_val:.4f})",
            f"last checkpoint  {last}",
            f"weights          {weights}  (loads into the article's nn.Sequential)",
            f"config           {config}  (--config reproduces this run)",
            f"results          {run_dir / 'results.json'}",
            f"TensorBoard      tensorboard --logdir {run_dir}",
        ]
    lines.append(f"wall time {time.perf_counter() - started:.1f} s")
    rank_zero_info("\n".join(lines))
    model.log_test_figures()  # after the summary: matplotlib takes a second on a small CPU
    return 0


if __name__ == "__main__":
    run_cli(main, "train.py")
