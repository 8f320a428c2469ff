"""Every script command in the README and docs/, run as printed, in page order, in a fresh clone.

Minutes of real runs, so it runs when asked (``RUN_DOCS=1``), not in every ``make test``; it needs the real
MNIST files (``DATA_DIR``), which it links in as the clone's ``data/``, the folder a fresh shell's commands
read. Each command runs from the clone's folder in a shell without ``DATA_DIR``, at small size: one epoch
where the command sets no ``--max-epochs``, one or two sweep trials, the benchmark on 2,000 samples. The files
a reader is assumed to have (``photo.jpg``, ``scans/``, ``~/pets``, ``~/new-photos``) are made first. GPU-only
commands and the one that needs a database server named ``db`` are listed and skipped. Pass: every command
exits 0 with no traceback; ``pytest -s`` prints each with its time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"((?:[A-Z_]+=\S+ )*)(?:\.venv/bin/)?python3? scripts/(\w+\.py)((?:[^`\n#]|#(?!\s))*)")
MAKE_TRAIN = re.compile(r'make train ARGS="([^"]*)"')
NEEDS_A_GPU = ("--accelerator gpu", "--config gpu-ddp")
NEEDS_A_SERVER = ("postgresql://user:pw@db", "sweeps/mnist-pg/")


def commands() -> list[tuple[str, dict[str, str], str, list[str]]]:
    """(where, environment, script, argv) for each command the pages show, in page order."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.name}:{number}"
            for match in COMMAND.finditer(line):
                args = match.group(3).split("&&")[0].strip().rstrip("`;,.)")
                if "..." in args or "<" in args or "|" in args or args.startswith(">"):
                    continue
                env = dict(part.split("=", 1) for part in match.group(1).split())
                found.append((where, env, match.group(2), shlex.split(args.split(" > ")[0])))
            for match in MAKE_TRAIN.finditer(line):
                found.append((where, {}, "train.py", shlex.split(match.group(1))))
    return found


def small(script: str, argv: list[str]) -> list[str]:
    """The command at small size: what it does, on less."""
    if script == "train.py" and not {"--help", "--resume", "--print-config"} & set(argv) and \
            "--max-epochs" not in argv:
        return [*argv, "--max-epochs", "1"]
    if script == "sweep.py":
        at_once = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 1
        return [*(a if i == 0 or argv[i - 1] != "--n-trials" else str(at_once) for i, a in enumerate(argv))]
    if script == "benchmark.py":
        return [*argv, "--limit", "2000", "--epochs", "1"]
    return argv


def skipped_why(argv: list[str]) -> str | None:
    line = " ".join(argv)
    if any(need in line for need in NEEDS_A_GPU):
        return "needs a GPU"
    if any(need in line for need in NEEDS_A_SERVER):
        return "needs the PostgreSQL server the command names"
    return None


def what_a_reader_has(clone: Path, home: Path, mnist: Path) -> None:
    """The files the pages assume: MNIST in data/, a photo, a folder of scans, folders of pets and new photos."""
    from PIL import Image
    from torchvision import datasets

    from tests.helpers import draw_shapes

    (clone / "data").mkdir()
    (clone / "data" / "MNIST").symlink_to(mnist / "MNIST")
    test = datasets.MNIST(mnist, train=False)
    (clone / "scans").mkdir()
    for index in range(8):
        Image.fromarray(test.data[index].numpy()).resize((84, 84)).save(clone / "scans" / f"digit{index}.png")
    Image.fromarray(test.data[8].numpy()).convert("RGB").save(clone / "photo.jpg")
    draw_shapes(home / "pets")
    (home / "new-photos").mkdir()
    for path in sorted((home / "pets" / "circle").iterdir())[:3]:
        shutil.copy(path, home / "new-photos" / path.name)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RUN_DOCS") != "1", reason="runs every documented command (minutes): RUN_DOCS=1")
def test_every_documented_command_runs_as_printed(real_data_dir: Path, tmp_path: Path) -> None:
    clone, home = tmp_path / "clone", tmp_path / "home"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    what_a_reader_has(clone, home, real_data_dir)
    shell = {**{k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "PROJECT_RECIPE", "PYTHONPATH")},
             "HOME": str(home)}
    failed, report, outputs = [], [], {}
    for where, env, script, argv in commands():
        shown = " ".join([*(f"{k}={v}" for k, v in env.items()), f"scripts/{script}", *argv])
        why = skipped_why(argv)
        if why:
            report.append(f"{where:18} skipped ({why}): {shown}")
            continue
        if script == "new_recipe.py" and (clone / argv[0]).exists():
            shutil.rmtree(clone / argv[0])  # each page's walk-through starts without the package it writes
        expanded = [str(home) + a[1:] if a.startswith("~/") else a for a in small(script, argv)]  # as a shell does
        started = time.perf_counter()
        done = subprocess.run([str(clone / ".venv" / "bin" / "python"), f"scripts/{script}", *expanded],
                              cwd=clone, env={**shell, **env}, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - started
        output = done.stdout + done.stderr
        outputs[where] = done
        ok = done.returncode == 0 and "Traceback" not in output
        report.append(f"{where:18} {'ok  ' if ok else 'FAIL'} {seconds:5.1f} s  {shown}")
        if not ok:
            failed.append(f"{where} {shown}: exit {done.returncode}: {output.strip().splitlines()[-1:]}")
    print("\n".join(report))
    assert not failed, "\n".join(failed)
    assert len(report) >= 50
    the_outputs_the_pages_show(outputs)


def shown_block(page: str, first: str) -> list[str]:
    """The lines of the page's first fenced block that starts with ``first``."""
    text = (ROOT / page).read_text()
    return next(body.splitlines() for body in re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)
                if body.startswith(first))


def labels(lines: list[str]) -> list[str]:
    """Each line's words before its first number or path: what a line says, not this run's values."""
    return [re.match(r"[A-Za-z ]*[A-Za-z]", line).group() for line in lines]


def the_outputs_the_pages_show(outputs: dict[str, subprocess.CompletedProcess]) -> None:
    """The pages' sample outputs, as the commands printed them here (other values: other epochs)."""
    run = outputs["article.md:17"]  # train.py --config article: a default run's output
    printed = [line for line in run.stderr.splitlines() if line.startswith("epoch ")][-1:] + run.stdout.splitlines()
    assert labels(printed) == labels(shown_block("README.md", "epoch ")), printed
    card = shown_block("docs/adapt.md", "data: ")[0]
    assert card in run.stderr.splitlines(), run.stderr  # MNIST's data card, exactly
    listed = outputs["results.md:8"].stdout.splitlines()[0].split()
    assert listed == shown_block("docs/results.md", "run ")[0].split()
