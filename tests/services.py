"""Real services the tests start for themselves: a throwaway PostgreSQL server on loopback, a one-node SLURM.

Where a service is not installed its tests skip with the reason, except under
``REQUIRE_SERVICES=1`` (set by ``.ci/run``), where they fail: CI must run them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import HANG_S


def missing(reason: str) -> None:
    if os.environ.get("REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (REQUIRE_SERVICES=1: this run must have it)")
    pytest.skip(reason)


def postgres_tool(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)



def free_port() -> int:
    """A loopback port no process listens on now, as the kernel picks one (not Python's ``random``, which a test's
    ``seed_everything`` makes repeat across sessions, so that two sessions, or one and a leftover server, collide)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

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
                   capture_output=True, timeout=HANG_S)
    server = None
    for _ in range(5):  # a port another process took in between: try another
        port = free_port()
        started = subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
                                  f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"],
                                 capture_output=True, text=True, timeout=HANG_S)
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
                       timeout=HANG_S)
        shutil.rmtree(folder, ignore_errors=True)


class Slurm:
    """A one-node SLURM cluster on localhost (munged, slurmctld, slurmd), its clients pointed at it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=HANG_S, env=self.env)

    def sbatch(self, *args: str) -> int:
        done = self.run("sbatch", "--parsable", *args)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().split(";")[0])

    def job(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", str(job)).stdout
        return dict(part.split("=", 1) for part in text.split() if "=" in part)


SLURM_CONF = """\
ClusterName=tests
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=10
MinJobAge=600
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
MpiDefault=none
ReturnToService=2
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldPort={port}
SlurmdPort={port_d}
NodeName=localhost CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def slurm_cluster() -> Iterator[Slurm]:
    """munged on a socket of its own, then slurmctld and slurmd, all in a temporary folder (as root); stopped after."""
    daemons = [shutil.which(name) for name in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")]
    if not all(daemons) and not all(os.path.exists(f"/usr/sbin/{n}") for n in ("munged", "slurmctld", "slurmd")):
        missing("SLURM is not installed (apt-get install slurmd slurmctld munge slurm-client)")
    if os.geteuid() != 0:
        missing("the SLURM tests start slurmd, which needs root")
    munged, slurmctld, slurmd = (shutil.which(n) or f"/usr/sbin/{n}" for n in ("munged", "slurmctld", "slurmd"))
    folder = Path(tempfile.mkdtemp(prefix="slurm-"))
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(folder=folder, port=free_port(), port_d=free_port()))
    key = folder / "munge.key"  # a key of its own: nothing of the machine's munge is touched
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    subprocess.run([munged, "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
                    f"--log-file={folder}/munged.log", f"--pid-file={folder}/munged.pid",
                    f"--seed-file={folder}/munged.seed"], check=True, capture_output=True, timeout=HANG_S)
    cluster = Slurm(folder)
    try:
        subprocess.run([slurmctld, "-f", str(conf)], check=True, capture_output=True, timeout=HANG_S, env=cluster.env)
        subprocess.run([slurmd, "-f", str(conf), "-N", "localhost"], check=True, capture_output=True, timeout=HANG_S,
                       env=cluster.env)
        deadline = time.monotonic() + HANG_S
        while "idle" not in cluster.run("sinfo", "-h", "-o", "%T").stdout:
            if time.monotonic() > deadline:
                pytest.fail(f"the SLURM node never became idle: {(folder / 'slurmctld.log').read_text()[-800:]}")
            time.sleep(0.5)
        yield cluster
    finally:
        for name in ("slurmd", "slurmctld", "munged"):
            pid = folder / f"{name}.pid"
            if pid.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid.read_text().strip()), signal.SIGTERM)
        time.sleep(1)
        shutil.rmtree(folder, ignore_errors=True)
