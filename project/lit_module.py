"""The training recipe: steps, metrics and optimisers around the plain ``MLP``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from project import NUM_CLASSES, OPTIMIZERS, SCHEDULERS, figures
from project.errors import UserError
from project.model import MLP


def _accuracy() -> MulticlassAccuracy:
    # validate_args=False: the inputs are ours and well-formed; the checks cost a host sync per step.
    return MulticlassAccuracy(num_classes=NUM_CLASSES, average="micro", validate_args=False)


class WorstMistakes:
    """The test images misclassified with the highest loss, kept as a running top-k on the device."""

    def __init__(self, k: int = 32) -> None:
        self.k = k
        self.reset()

    def reset(self) -> None:
        self.loss = self.images = self.log_probs = self.targets = None

    def update(self, images: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = nn.functional.nll_loss(log_probs, targets, reduction="none")
        loss = torch.where(log_probs.argmax(1) != targets, loss, torch.full_like(loss, -torch.inf))
        if self.loss is not None:
            loss = torch.cat([self.loss, loss])
            images = torch.cat([self.images, images])
            log_probs = torch.cat([self.log_probs, log_probs])
            targets = torch.cat([self.targets, targets])
        keep = loss.topk(min(self.k, len(loss))).indices
        self.loss, self.images, self.log_probs, self.targets = loss[keep], images[keep], log_probs[keep], targets[keep]

    def compute(self, module: L.LightningModule) -> dict[str, torch.Tensor]:
        """Gather every rank's candidates (all ranks must call this) and keep the real mistakes."""
        parts = [self.loss, self.images, self.log_probs, self.targets]
        if module.trainer.world_size > 1:
            parts = [module.all_gather(p).flatten(0, 1) for p in parts]
        loss, images, log_probs, targets = parts
        order = loss.argsort(descending=True)[: self.k]
        order = order[torch.isfinite(loss[order])]
        probs = log_probs[order].float().exp()
        return {"images": images[order].cpu(), "predicted": probs.argmax(1).cpu(), "true": targets[order].cpu(),
                "confidence": probs.max(1).values.cpu()}


class LitMNIST(L.LightningModule):
    """Classifies MNIST with the article's MLP, trained with ``NLLLoss`` on log-probabilities."""

    def __init__(
        self,
        hidden: Sequence[int] = (128,),
        optimizer: str = "sgd",
        lr: float = 0.2,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        scheduler: str = "onecycle",
    ) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        # Plain values only, so checkpoints load under torch.load(weights_only=True).
        self.save_hyperparameters(
            {
                "hidden": [int(h) for h in hidden],
                "optimizer": optimizer,
                "lr": float(lr),
                "momentum": float(momentum),
                "weight_decay": float(weight_decay),
                "scheduler": scheduler,
            },
            logger=False,
        )
        self.model = MLP(hidden)
        self.loss_fn = nn.NLLLoss()
        self.train_acc, self.val_acc, self.test_acc = _accuracy(), _accuracy(), _accuracy()
        # No train loss metric: the step losses the logger writes are the training curve,
        # and a per-step MeanMetric update would cost more than the MLP's own step.
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_confusion = MulticlassConfusionMatrix(num_classes=NUM_CLASSES, validate_args=False)
        self.test_confusion = MulticlassConfusionMatrix(num_classes=NUM_CLASSES, validate_args=False)
        self.worst = WorstMistakes()
        self._schedule_restored = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        log_probs = self.model(x)
        loss = self.loss_fn(log_probs, y)
        self.train_acc.update(log_probs.detach(), y)
        if batch_idx == 0 and self.global_step == 0:
            self._image("train/first_batch", figures.batch_grid(x))
        # self.log costs more than the MLP's step: only the steps the logger writes pay for it.
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log("train/loss", loss.detach(), prog_bar=True)
        return loss

    def _eval_step(
        self, stage: str, batch: tuple[torch.Tensor, torch.Tensor], loss: MeanMetric, acc: MulticlassAccuracy,
        confusion: MulticlassConfusionMatrix,
    ) -> torch.Tensor:
        x, y = batch
        log_probs = self.model(x)
        loss.update(self.loss_fn(log_probs, y), weight=y.shape[0])
        acc.update(log_probs, y)
        confusion.update(log_probs, y)
        # Logging the metric objects: Lightning computes them at epoch end, synced across DDP
        # ranks, and resets them.
        self.log(f"{stage}/loss", loss, prog_bar=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)
        return log_probs

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch, self.val_loss, self.val_acc, self.val_confusion)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        log_probs = self._eval_step("test", batch, self.test_loss, self.test_acc, self.test_confusion)
        self.worst.update(batch[0], log_probs, batch[1])

    def on_test_epoch_start(self) -> None:
        self.worst.reset()
        self.test_confusion.reset()

    def on_test_epoch_end(self) -> None:
        # Both are collectives under DDP: every rank takes part; pictures are drawn later, once.
        self.test_results = {"confusion": self.test_confusion.compute().cpu(), **self.worst.compute(self)}

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(x).exp()

    def on_train_epoch_end(self) -> None:
        self.log("train/acc", self.train_acc, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        confusion = self.val_confusion.compute()
        self.val_confusion.reset()
        if not self.trainer.sanity_checking:
            self._image("val/confusion_matrix", figures.confusion_heatmap(confusion))
            self.val_acc_best.update(self.val_acc.compute())
            # Already synced by compute(); sync_dist only marks the value as global (no-op mean).
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)

    def _tensorboard(self) -> TensorBoardLogger | None:
        return next((lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)), None)

    def _image(self, tag: str, image: torch.Tensor) -> None:
        tensorboard = self._tensorboard()
        if tensorboard is not None:
            tensorboard.experiment.add_image(tag, image, self.global_step)

    def log_test_figures(self) -> None:
        """Matplotlib figures of the last test: drawn once, after the results are printed."""
        results = getattr(self, "test_results", None)
        tensorboard = self._tensorboard()
        if not results or tensorboard is None or not self.trainer.is_global_zero:
            return
        experiment = tensorboard.experiment
        experiment.add_figure("test/confusion_matrix",
                              figures.confusion_figure(results["confusion"], "test set"), self.global_step)
        if len(results["images"]):
            experiment.add_figure("test/worst_misclassified", figures.misclassified_figure(
                results["images"], results["predicted"], results["true"], results["confidence"]), self.global_step)
        experiment.flush()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a resume into a model of another shape, before any weights are loaded."""
        self._schedule_restored = bool(checkpoint.get("lr_schedulers"))
        saved = checkpoint.get("hyper_parameters", {})
        if saved.get("hidden") is not None and list(saved["hidden"]) != list(self.hparams.hidden):
            raise UserError(
                f"the checkpoint has hidden sizes {saved['hidden']}, this run asks for "
                f"{list(self.hparams.hidden)}; resume with --hidden {','.join(map(str, saved['hidden']))}"
            )

    def on_train_start(self) -> None:
        """A one-cycle schedule restored from a checkpoint must span the steps these flags will run."""
        if not self._schedule_restored:
            return
        self._schedule_restored = False
        planned = int(self.trainer.estimated_stepping_batches)
        for config in self.trainer.lr_scheduler_configs:
            total = getattr(config.scheduler, "total_steps", None)
            if total is not None and total != planned:
                raise UserError(
                    f"the checkpoint's onecycle schedule spans {total} steps but these flags give {planned}; "
                    "resume with the same --max-epochs and --batch-size (or train with --scheduler none)"
                )

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = self.model.parameters()
        if hp.optimizer == "sgd":
            optimizer = torch.optim.SGD(
                params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay,
                nesterov=hp.momentum > 0,
            )
        elif hp.optimizer == "adam":
            optimizer = torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay)
        else:
            optimizer = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.scheduler == "none":
            return optimizer
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=hp.lr, total_steps=int(self.trainer.estimated_stepping_batches)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
