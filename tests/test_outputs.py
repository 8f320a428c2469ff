"""What every output holds: no credential in any form (stdout, stderr, every file a run or a sweep writes), and no
progress bar in a log."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, ROOT, TINY, event_accumulator, one_line_error, run_script, tiny_config
from project.errors import redact, redact_values

# Each form a URL or DSN carries a credential in; every SECRETn must go, everything else stay.
FORMS = [
    ("postgresql://ann:SECRET1@db.example:5432/optuna", "postgresql://ann:***@db.example:5432/optuna"),
    ("postgresql://:SECRET1@db/optuna", "postgresql://:***@db/optuna"),
    ("postgresql+psycopg://ann@db/optuna?password=SECRET1&sslpassword=SECRET2&application_name=sweep",
     "postgresql+psycopg://ann@db/optuna?password=***&sslpassword=***&application_name=sweep"),
    ("postgresql://db/optuna?user=ann&passfile=/home/ann/SECRET1.pgpass", "postgresql://db/optuna?user=ann&passfile=***"),
    ("mysql+pymysql://root:SECRET1@db:3306/optuna?charset=utf8mb4", "mysql+pymysql://root:***@db:3306/optuna?charset=utf8mb4"),
    ("mysql://root@db/optuna?passwd=SECRET1", "mysql://root@db/optuna?passwd=***"),
    ("oracle+oracledb://scott:SECRET1@db:1521/?service_name=x&access_token=SECRET2",
     "oracle+oracledb://scott:***@db:1521/?service_name=x&access_token=***"),
    ("mssql+pyodbc://sa:SECRET1@dsn?client_secret=SECRET2&driver=ODBC", "mssql+pyodbc://sa:***@dsn?client_secret=***&driver=ODBC"),
    ("host=db user=ann password=SECRET1 dbname=optuna", "host=db user=ann password=*** dbname=optuna"),
    ("host=db password='SECRET1 with spaces' dbname=optuna", "host=db password=*** dbname=optuna"),
    ("redis://default:SECRET1@cache:6379/0", "redis://default:***@cache:6379/0"),
    ("https://api.example/v1?api_key=SECRET1&page=2", "https://api.example/v1?api_key=***&page=2"),
]
SECRETS = re.compile(r"SECRET\d")


@pytest.mark.parametrize(("given", "shown"), FORMS)
def test_each_credential_form_is_masked_and_nothing_else(given, shown):
    assert redact(given) == shown
    assert redact(f"error: --storage {given}: cannot open it") == f"error: --storage {shown}: cannot open it"
    assert redact_values({"a": [given, 3], "b": {"c": given}}) == {"a": [shown, 3], "b": {"c": shown}}


def test_settings_without_credentials_are_left_alone():
    for text in ("--lr 0.1 --storage sweeps/mnist.journal", "postgresql://postgres@127.0.0.1:5432/optuna",
                 "lightning_logs/mnist/version_3/checkpoints/best-epoch05-acc0.9796.ckpt", "compass=north"):
        assert redact(text) == text


def found_secrets(*texts: str, under: Path | None = None) -> list[str]:
    """Every secret in the texts and in every file under ``under`` (TensorBoard event files included)."""
    hits = [SECRETS.search(text).group() for text in texts if SECRETS.search(text)]
    files = [p for p in under.rglob("*") if p.is_file()] if under else []
    return hits + [f"{p}: {m.group().decode()}" for p in files if (m := re.search(rb"SECRET\d", p.read_bytes()))]


def with_secrets(url: str) -> str:
    """A real PostgreSQL URL with a password in each place one can go (the server trusts loopback: none is used)."""
    return (url.replace("postgres@", "postgres:SECRET1@")
            + "?password=SECRET2&sslpassword=SECRET3&passfile=/nowhere/SECRET4.pgpass&application_name=sweep")


@pytest.mark.slow
def test_a_sweep_on_a_url_with_passwords_writes_none_anywhere(postgres, shared_tiny_data, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("fixed:\n  scheduler: none\n  max_epochs: 1\n  batch_size: 32\n"
                     "params:\n  lr: {type: float, low: 0.01, high: 0.3}\n")
    logdir = tmp_path / "logs"
    url = with_secrets(postgres.new_database())
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--space", str(space), "--storage", url,
                           "--data-dir", str(shared_tiny_data), "--logdir", str(logdir), "--val-size", "40",
                           "--n-trials", "1"],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert "postgres:***@127.0.0.1" in done.stdout and "password=***&sslpassword=***&passfile=***" in done.stdout
    trial = next(logdir.rglob("run.json")).parent
    command = event_accumulator(trial).Tensors("run/command/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "password=***&sslpassword=***" in command  # the sweep's command line, in the trial's TEXT tab
    assert found_secrets(done.stdout, done.stderr, under=logdir) == []

    unreachable = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:1", url)
    refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), "--space", str(space), "--storage",
                              unreachable, "--data-dir", str(shared_tiny_data), "--logdir", str(tmp_path / "none"),
                              "--n-trials", "1"], capture_output=True, text=True, timeout=HANG_S)
    assert refused.returncode == 2
    line = one_line_error(refused.stderr, "sweep.py")
    assert "postgres:***@127.0.0.1:1/" in line and "?password=***&sslpassword=***&passfile=***" in line
    assert found_secrets(refused.stdout, refused.stderr) == []


def test_a_run_started_from_a_command_with_credentials_writes_none(shared_tiny_data, tmp_path, monkeypatch):
    """An in-process run (a sweep's trial) whose command line holds every form: its TEXT tab, HPARAMS, run.json,
    config.yaml, results.json and checkpoints hold none of them."""
    from helpers import train

    monkeypatch.setattr(sys, "argv", ["sweep.py", *(part for given, _ in FORMS for part in ("--storage", given))])
    result = train(tiny_config(shared_tiny_data, tmp_path, max_epochs=1, accelerator="cpu"))
    command = event_accumulator(result.run_dir).Tensors("run/command/text_summary")[0].tensor_proto.string_val[0]
    assert all(shlex.quote(shown) in command.decode() for _, shown in FORMS)
    assert found_secrets(under=tmp_path) == []


@pytest.mark.slow
def test_the_tuners_draw_no_bar_into_a_log(shared_tiny_data, tmp_path):
    """stderr to a file: the LR finder's and batch-size finder's notes, one plain line per epoch, no tqdm bar."""
    log = tmp_path / "train.log"
    with open(log, "w") as stderr:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--data-dir", str(shared_tiny_data),
                               "--logdir", str(tmp_path / "logs"), *TINY, "--max-epochs", "2", "--find-lr",
                               "--find-batch-size", "--accelerator", "cpu"],
                              stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=HANG_S)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "LR finder: " in text and "batch-size finder: " in text  # the tuners ran
    assert "\r" not in text and "it/s]" not in text and "Finding best initial lr" not in text
    assert len(re.findall(r"^epoch \d/2  step \d+ ", text, re.MULTILINE)) == 2

    evaluated = run_script("evaluate.py", "--data-dir", str(shared_tiny_data), "--logdir", str(tmp_path / "logs"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "\r" not in evaluated.stderr and "it/s]" not in evaluated.stderr


def test_the_lr_finder_module_gets_its_own_bar_back():
    """The bar is off only while the tuners run in a log; a later finder on a terminal draws it again."""
    import lightning as L
    from lightning.pytorch.tuner import lr_finder

    from project.training.tuning import bars_only_on_a_terminal

    drawing = lr_finder.tqdm
    trainer = L.Trainer(enable_progress_bar=False, logger=False, enable_checkpointing=False)
    with bars_only_on_a_terminal(trainer):
        assert lr_finder.tqdm(total=3).disable
    assert lr_finder.tqdm is drawing
