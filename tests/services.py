"""Real services the tests start for themselves: a throwaway PostgreSQL server on loopback.

Where a service is not installed its tests skip with the reason, except under
``REQUIRE_SERVICES=1`` (set by ``.ci/run``), where they fail: CI must run them.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def missing(reason: str) -> None:
    if os.environ.get("REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (REQUIRE_SERVICES=1: this run must have it)")
    pytest.skip(reason)


def postgres_tool(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class Postgres:
    """A PostgreSQL server in a temporary folder, listening on 127.0.0.1; each test gets its own database."""

    def __init__(self, folder: Path, port: int, as_user: list[str]) -> None:
        self.folder, self.port, self.as_user = folder, port, as_user

    def new_database(self) -> str:
        """A fresh, empty database; its SQLAlchemy URL."""
        import psycopg

        name = f"optuna_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """``initdb`` and ``pg_ctl start`` (as the ``postgres`` user when run as root); stopped and removed after."""
    initdb, pg_ctl = postgres_tool("initdb"), postgres_tool("pg_ctl")
    if not initdb or not pg_ctl:
        missing("PostgreSQL is not installed (no initdb/pg_ctl)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg is not installed: pip install -e '.[postgres]'")
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="pg-"))
    if as_user:
        shutil.chown(folder, "postgres", "postgres")
    data = folder / "data"
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True, timeout=120)
    server = None
    for _ in range(5):  # a port another process took in between: try another
        port = random.randint(20000, 60000)
        started = subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                                  f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                                 capture_output=True, text=True, timeout=120)
        if started.returncode == 0:
            server = Postgres(folder, port, as_user)
            break
    if server is None:
        log = (folder / "log").read_text() if (folder / "log").exists() else started.stderr
        shutil.rmtree(folder, ignore_errors=True)
        pytest.fail(f"PostgreSQL did not start: {log[-500:]}")
    try:
        yield server
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True,
                       timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
