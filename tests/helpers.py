"""Helpers shared by the tests: the tests' recipe's tiny data, script runs, summary parsing."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Every wait a test puts on a process or a service: only a hang reaches it. A slow or loaded machine does not (the
# slowest script run, a 2-rank DDP job, takes about 40 s on an idle 2-core machine; at a load of 30, ten times that).
HANG_S = 1800.0
TRAIN = str(ROOT / "scripts" / "train.py")
# What a run logs by the wall clock: in a run and its resumed twin, the same steps, other values.
TIMED = ("train/epoch_time_s", "train/samples_per_s", "train/peak_memory_mb")
# Small, fast settings for runs on tiny data.
TINY = ("--batch-size", "32", "--log-every-n-steps", "2", "--val-size", "40")
TINY_SETTINGS = {"batch_size": 32, "log_every_n_steps": 2, "val_size": 40}
# Runs the fault tests interrupt: 640 training images in batches of 32 are 20 steps per epoch on one
# process, 10 per rank on two; last.ckpt every 3 steps, so most kills land mid-epoch.
CHECKPOINTED = (*TINY, "--checkpoint-every-n-steps", "3", "--accelerator", "cpu")
TWO_RANKS = ("--devices", "2", "--max-epochs", "4")


def make_tiny_data(root: Path, n_train: int = 240, n_test: int = 80, seed: int = 0,
                   wrong_labels: float = 0.0) -> Path:
    """The tests' recipe's data (``tests/tiny_recipe``): class k lights up a band of rows, plus noise."""
    from tests.tiny_recipe.data import write_tiny

    return write_tiny(root, n_train, n_test, seed, wrong_labels)


def make_bars(root: Path, n_train: int = 400, n_test: int = 100, seed: int = 0) -> Path:
    """The second recipe's data (``tests/second_recipe``), as that recipe writes its example."""
    from tests.second_recipe.data import write_bars

    return write_bars(root, n_train, n_test, seed)


def swapped_template(dest: Path, recipe: Path = ROOT / "tests" / "second_recipe") -> Path:
    """A copy of the template with ``recipe`` in place of ``project/recipe/``, as a user would swap it."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("project", "scripts", "tests"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    shutil.rmtree(dest / "project" / "recipe")
    shutil.copytree(recipe, dest / "project" / "recipe", ignore=ignore)
    return dest


def run_script(script: str, *args: str, timeout: float = HANG_S, env: dict | None = None,
               cwd: Path | None = None, root: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``root``'s ``scripts/<script>`` in a fresh interpreter, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, str(root / "scripts" / script), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or root,
    )


def run_script_warm(script: str, *args: str, cwd: Path = ROOT, timeout: float = HANG_S, env: dict | None = None,
                    root: Path = ROOT) -> subprocess.CompletedProcess:
    """``run_script`` without the interpreter's start: ``root``'s ``scripts/<script>`` run as its ``__main__`` in a
    process forked from one that has imported torch and Lightning already (``multiprocessing``'s fork server, one
    per test process), so that each run does not pay their import again. Everything else is the script's own, as
    from a shell: its argv, its folder, its environment, the ``sys.path`` a fresh interpreter would have (the
    script's folder, ``PYTHONPATH``, the installed packages: the project imported anew from ``root``), its exit
    code, stdout and stderr apart. For one process: a DDP run, which starts its ranks from ``sys.argv``, runs in
    ``run_script``, as does a test of what a fresh interpreter prints or imports."""
    import multiprocessing
    import tempfile

    global _WARM, _FRESH_PATH
    if _WARM is None:
        _WARM = multiprocessing.get_context("forkserver")
        _WARM.set_forkserver_preload(["torch", "lightning", "helpers"])
        clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        _FRESH_PATH = subprocess.run([sys.executable, "-c", "import sys; print(*sys.path[1:], sep='\\n')"],
                                     env=clean, capture_output=True, text=True, check=True, cwd="/").stdout.splitlines()
    path = root / "scripts" / script
    with tempfile.TemporaryDirectory() as scratch:
        out, err = Path(scratch) / "out", Path(scratch) / "err"
        child_env = {**os.environ, **(env or {})}
        process = _WARM.Process(target=_script_main, args=(str(path), list(args), str(cwd), child_env, str(out),
                                                            str(err), _FRESH_PATH))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([script, *args], timeout)
        return subprocess.CompletedProcess([script, *args], process.exitcode, out.read_text(), err.read_text())


_WARM: Any = None
_FRESH_PATH: list[str] = []


def _script_main(path: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str,
                 fresh_path: list[str]) -> None:
    """The child of ``run_script_warm``: the script as ``python path args`` would run it."""
    import atexit
    import multiprocessing
    import runpy

    multiprocessing.set_start_method(None, force=True)  # the platform's own, as in a fresh interpreter (not ours)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [str(Path(path).parent), *extra, *fresh_path]
    for fd, file in ((1, out), (2, err)):
        os.dup2(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stdout, flushed at exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [path, *args]
    code: int = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except BaseException:  # noqa: BLE001 - what the interpreter would print for an uncaught error
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at its exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def one_process(args: tuple[str, ...] | list[str]) -> bool:
    """A command line that starts no DDP ranks (no ``--devices`` beyond 1, no strategy, nodes or preset): it may run
    warm (``run_script_warm``)."""
    for flag, value in zip(args, [*args[1:], ""], strict=True):
        if (flag == "--devices" and value != "1") or (flag.startswith("--devices=") and flag != "--devices=1"):
            return False
        if flag.startswith(("--strategy", "--num-nodes", "--config", "--trainer.strategy", "--trainer.devices",
                            "--trainer.num_nodes")):
            return False
    return True


def run_script_fitting(script: str, *args: str, timeout: float = HANG_S, env: dict | None = None,
                       cwd: Path | None = None, root: Path = ROOT) -> subprocess.CompletedProcess:
    """``run_script_warm`` where the command starts no ranks (``one_process``), else ``run_script``."""
    if one_process(args):
        return run_script_warm(script, *args, cwd=cwd or root, timeout=timeout, env=env, root=root)
    return run_script(script, *args, timeout=timeout, env=env, cwd=cwd, root=root)


def run_in(template: Path, script: str, *args: str, timeout: float = HANG_S,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` of another copy of the template (``swapped_template``), from its folder, on the
    recipe installed there."""
    return run_script_fitting(script, *args, timeout=timeout, env={"PROJECT_RECIPE": "project.recipe", **(env or {})},
                              root=template)


def tiny_run(data_dir: Path, logdir: Path, *extra: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    return run_script_fitting("train.py", "--data-dir", str(data_dir), "--logdir", str(logdir), *TINY, *extra,
                              timeout=timeout)


class FakeClock:
    """A clock that moves only when told: what the measurements must find, at any machine speed."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def tiny_recipe() -> Any:
    """The engine's tests' recipe, ``tests/tiny_recipe``, as a value (what ``PROJECT_RECIPE`` names for scripts)."""
    from project.contract import load_recipe

    return load_recipe("tests.tiny_recipe")


def tiny_config(data_dir: Path, logdir: Path, **settings: Any) -> Any:
    """A ``RunConfig`` of the tests' recipe for an in-process ``train()`` on tiny data (no progress bar)."""
    from project.config.schema import RunConfig

    trainer = {"enable_progress_bar": False, **settings.pop("trainer", {})}
    return RunConfig.for_recipe(tiny_recipe(), data_dir=str(data_dir), logdir=str(logdir),
                                **{**TINY_SETTINGS, **settings}, trainer=trainer)


def train(config: Any, **kwargs: Any) -> Any:
    """``project.training.run.train`` of the tests' recipe, in this process."""
    from project.training.run import train as train_recipe

    return train_recipe(config, tiny_recipe(), **kwargs)


def parse_run_config(argv: list[str]) -> Any:
    """``train.py``'s command line, for the tests' recipe: the run's ``RunConfig``."""
    return parse_run_command_of(tiny_recipe(), argv)


def parse_run_command_of(recipe: Any, argv: list[str]) -> Any:
    """``train.py``'s command line for ``recipe``: the run's ``RunConfig``."""
    from project.config.cli import parse_run_command

    return parse_run_command(recipe, argv)[0]


def summary_value(output: str, key: str) -> str:
    match = re.search(rf"^{re.escape(key)}\s+(\S+)", output, re.MULTILINE)
    assert match, f"{key!r} missing from:\n{output}"
    return match.group(1)


def event_accumulator(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0, "histograms": 0})
    events.Reload()
    return events


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What a run prints on stderr before it fails mid-training: its data card (and the tests' small validation split's
# warning), Lightning's device lines, its epoch lines.
RUN_STARTED = (r"data: \d", r"data: warning: the validation split holds", r"GPU available: ", r"TPU available: ",
               r"Loading `train_dataloader`", r"epoch \d+/\d+  step \d+ ")


def one_line_error(stderr: str, prog: str = "train.py", after: tuple[str, ...] = ()) -> str:
    """The error a script printed: exactly one line, and nothing else on stderr but lines matching ``after``
    (patterns of what a run prints before it fails, e.g. ``RUN_STARTED``); no traceback."""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith(f"{prog}: error: "), stderr
    others = [line for line in lines[:-1] if not any(re.match(pattern, line) for pattern in after)]
    assert not others, f"more than the one error line: {others}"
    return lines[-1]


def newest_last_checkpoint(logdir: Path, name: str = "tiny") -> dict:
    """The ``last.ckpt`` of the newest ``version_N`` run under ``logdir/name``."""
    import torch

    newest = max((logdir / name).iterdir(), key=lambda p: int(p.name.split("_")[1]))
    return torch.load(newest / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold bitwise the same training: step, weights, optimizer, schedule, data position."""
    import torch

    from project.reliability.checkpointing import data_position

    assert a["global_step"] == b["global_step"] and a["epoch"] == b["epoch"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    assert a["optimizer_states"][0]["state"].keys() == b["optimizer_states"][0]["state"].keys()
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(),
                                b["optimizer_states"][0]["state"].values(), strict=True):
        assert state_a.keys() == state_b.keys()
        for name in state_a:
            assert torch.equal(state_a[name], state_b[name]), name
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert data_position(a) == data_position(b)  # the same place in the epoch's data order


def fill_file_system(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full: a real ENOSPC for every write after it."""
    with open(path, "wb") as stream:
        try:
            while True:
                stream.write(b"\0" * 65536)
                stream.flush()
        except OSError:
            pass


SHAPES = ("circle", "square", "triangle")


def draw_shapes(root: Path, per_class: int = 60, seed: int = 0, modes: tuple[str, ...] = ("L", "RGB")) -> Path:
    """Class folders of images as a user would have them: a light shape on a dark ground at a random place, in
    images of several sizes, grey and colour mixed."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    for name in SHAPES:
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            width, height = rng.choice([(40, 40), (64, 48), (30, 36), (80, 80)])
            mode = modes[index % len(modes)]
            image = Image.new(mode, (width, height), 30 if mode == "L" else (20, 30, 40))
            side = min(width, height) // 2
            x, y = rng.randint(0, width - side), rng.randint(0, height - side)
            fill = 220 if mode == "L" else (rng.randint(150, 255), rng.randint(150, 255), rng.randint(100, 255))
            draw = ImageDraw.Draw(image)
            if name == "circle":
                draw.ellipse([x, y, x + side, y + side], fill=fill)
            elif name == "square":
                draw.rectangle([x, y, x + side, y + side], fill=fill)
            else:
                draw.polygon([(x, y + side), (x + side, y + side), (x + side // 2, y)], fill=fill)
            image.save(root / name / f"{index:03d}.png")
    return root


def draw_glyphs(root: Path, classes: str = "ABCDE", per_class: int = 48, side: int = 28, seed: int = 0,
                colour: bool = False, noise_level: float = 40) -> Path:
    """Class folders of characters drawn as a hard data set is: each at a random size, place, slant and shade, on a
    noisy ground (with ``colour``, in random colours). A model needs many more steps than a short check gives to
    learn them, and does learn them."""
    import random

    import torch
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    noise = torch.Generator().manual_seed(seed)
    for name in classes:
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            mode = "RGB" if colour else "L"
            ground = tuple(rng.randint(0, 90) for _ in range(3)) if colour else rng.randint(0, 90)
            glyph = Image.new(mode, (side, side), ground)
            ink = tuple(rng.randint(140, 255) for _ in range(3)) if colour else rng.randint(140, 255)
            font = ImageFont.load_default(size=rng.randint(side // 2, side - 4))
            ImageDraw.Draw(glyph).text((rng.randint(0, side // 4), rng.randint(-side // 8, side // 6)), name,
                                       fill=ink, font=font)
            glyph = glyph.rotate(rng.uniform(-25, 25), fillcolor=ground)
            pixels = torch.frombuffer(bytearray(glyph.tobytes()), dtype=torch.uint8).float()
            pixels = (pixels + noise_level * torch.randn(pixels.shape, generator=noise)).clamp(0, 255).to(torch.uint8)
            glyph = Image.frombytes(mode, glyph.size, bytes(pixels.tolist()))
            glyph.save(root / name / f"{index:03d}.png")
    return root
