"""Under real 2-process DDP the ranks' training shards are disjoint, cover the split, and reshuffle each epoch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S

PROBE = Path(__file__).with_name("ddp_shard_probe.py")


@pytest.mark.slow
def test_ddp_ranks_see_disjoint_shards_that_cover_the_split(tmp_path):
    done = subprocess.run([sys.executable, str(PROBE), str(tmp_path)], capture_output=True, text=True,
                          timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 for r in ranks)
    orders = []
    for epoch in ("0", "1"):
        a, b = ranks[0]["seen"][epoch], ranks[1]["seen"][epoch]
        assert len(a) == len(b) == 48
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(96))
        orders.append(a)
    assert orders[0] != orders[1]  # reshuffled each epoch
