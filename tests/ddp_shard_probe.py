"""Run under 2-process CPU DDP: each rank records which training samples it saw per epoch.

Samples are numbered (target = index) so the test can check that the ranks' shards are
disjoint and cover the split. Started by tests/test_ddp_data.py.
"""

import json
import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from project.training.callbacks import quiet_known_warnings  # noqa: E402
from project.training.tensor_data import TensorPairs  # noqa: E402
from tests.tiny_recipe.data import TinyDataModule  # noqa: E402

N = 96


class NumberedData(TinyDataModule):
    def prepare_data(self):
        pass

    def setup(self, stage=None):
        self.train_set = TensorPairs(torch.arange(N, dtype=torch.float32).reshape(N, 1), torch.arange(N))


class Recorder(L.LightningModule):
    def __init__(self, out: Path):
        super().__init__()
        self.out = out
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.setdefault(self.current_epoch, []).extend(y.tolist())
        return self.layer(x).sum()

    def on_train_end(self):
        path = self.out / f"rank{self.global_rank}.json"
        path.write_text(json.dumps({"world_size": self.trainer.world_size, "seen": self.seen}))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


if __name__ == "__main__":
    quiet_known_warnings()
    out = Path(sys.argv[1])
    L.seed_everything(7, verbose=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0)
    trainer.fit(Recorder(out), datamodule=NumberedData(batch_size=8, seed=7))
