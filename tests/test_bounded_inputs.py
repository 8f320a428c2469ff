"""Every input read with a bound, every failure one line with nothing lost: pipes and devices where files are
expected, YAML that expands without end, images too large or of other depths, names that are paths, outputs that
cannot be written, a reader that goes away, a model too large, damaged logs and a disk that fails mid-save."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import HANG_S, ROOT, TINY, TRAIN, make_tiny_data, one_line_error, run_script_warm
from project.errors import ImageError, not_a_regular_file


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def finishes(*args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    """A script run that must end by itself (a read from a pipe nobody writes to would block it for good)."""
    return run_script_warm(*args, timeout=timeout)


def test_pipes_are_not_read_as_files(tmp_path):
    config = fifo(tmp_path / "config.yaml")
    done = finishes("train.py", "--config", str(config))
    assert "--config" in one_line_error(done.stderr) and "not a regular file" in done.stderr
    data = make_tiny_data(tmp_path / "data")
    images = data / "tiny" / "train.pt"
    images.unlink()
    fifo(images)
    done = finishes("train.py", "--data-dir", str(data), "--logdir", str(tmp_path / "logs"))
    assert f"{images}: not a regular file" in one_line_error(done.stderr)
    from project.results.image_files import read_resized

    with pytest.raises(ImageError, match="not a regular file"):
        read_resized(fifo(tmp_path / "digit.png"), (1, 28, 28))


def test_what_is_not_a_regular_file_is_named_before_anything_opens_it(tmp_path):
    """One check for every reader of a file: a pipe or device would block it, a folder or a link to nothing fail it."""
    fifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    problems = {name: not_a_regular_file(tmp_path / name)
                for name in ("pipe", "folder", "file", "dangling", "loop", "link", "missing")}
    assert problems == {
        "pipe": "not a regular file (a pipe or a device)", "folder": "is a directory, not a file", "file": None,
        "dangling": "a symbolic link that leads nowhere (its target is missing, or links loop)",
        "loop": "a symbolic link that leads nowhere (its target is missing, or links loop)", "link": None,
        "missing": None}
    assert not_a_regular_file(Path("/dev/null")) == "not a regular file (a pipe or a device)"


def test_yaml_that_expands_without_end_is_refused_in_one_short_line(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{name}: &{name} [*{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, "
        f"*{previous}, *{previous}, *{previous}]\n" for previous, name in zip("abcdefgh", "bcdefghi", strict=True))
    (tmp_path / "bomb.yaml").write_text(bomb + "hidden: *i\n")
    done = finishes("train.py", "--config", str(tmp_path / "bomb.yaml"))
    line = one_line_error(done.stderr)
    assert "expands to more than 10,000 values (YAML aliases)" in line and len(line) < 300


def test_images_of_other_depths_are_scaled_not_clipped(tmp_path):
    from project.results.image_files import read_resized

    ramp = np.arange(0, 256 * 16, 16, dtype=np.uint16).reshape(16, 16) * 16  # 0 .. 65280
    Image.fromarray(ramp).save(tmp_path / "deep.png")  # 16 bits a pixel
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    grey = read_resized(tmp_path / "deep.png", (1, 16, 16))
    assert float(grey.max()) == pytest.approx(65280 / 65535, abs=1 / 255) and float(grey.min()) == 0
    assert len(torch.unique(grey)) > 200  # scaled: not every bright pixel clipped to one value
    Image.fromarray((ramp / 65535).astype(np.float32)).save(tmp_path / "float.tiff")  # floats in [0, 1]
    assert torch.allclose(read_resized(tmp_path / "float.tiff", (1, 16, 16)), grey, atol=1.5 / 255)


def test_an_image_too_large_to_decode_is_refused_and_the_others_are_still_read(tmp_path):
    from project.results.image_files import read_resized

    Image.new("1", (20000, 20000)).save(tmp_path / "bomb.png")  # a few kB on disk, 400 million pixels
    with pytest.raises(ImageError, match="too large to decode"):
        read_resized(tmp_path / "bomb.png", (1, 28, 28))


def test_predict_keeps_one_row_per_file_whatever_its_name():
    from project.results.prediction import render_row

    row = render_row({"path": "scan\t1\nb\\c.png", "topk": [(3, 0.9), (5, 0.05)], "topk_names": ["3", "a\tb"]})
    assert row == "scan\\t1\\nb\\\\c.png\t3\t0.9000\ta\\tb:0.0500" and row.count("\t") == 3 and "\n" not in row


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path):
    for script, flag, value in [("evaluate.py", "--plot", str(tmp_path / "missing" / "cm.png")),
                                ("evaluate.py", "--plot", str(tmp_path / "cm.bmpx")),
                                ("plot_scalars.py", "--out", str(tmp_path / "missing" / "s.png")),
                                ("benchmark.py", "--out", str(tmp_path / "file.txt" / "out"))]:
        (tmp_path / "file.txt").write_text("")
        extra = ("run",) if script == "plot_scalars.py" else ()
        done = finishes(script, *extra, flag, value)
        assert done.returncode == 2 and flag in one_line_error(done.stderr, script), done.stderr


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder no user can write in")
def test_an_output_folder_the_filesystem_refuses_is_one_line(tmp_path):
    """Permission checks pass for root on /proc; the write itself fails, and that is said in one line too."""
    data = make_tiny_data(tmp_path / "data")
    done = finishes("benchmark.py", "--data-dir", str(data), "--out", "/proc/benchmark-results", "--limit", "64")
    assert done.returncode == 2 and "cannot make the folder" in one_line_error(done.stderr, "benchmark.py")


def test_a_reader_that_goes_away_stops_no_run(tmp_path):
    """``train.py | head -1``: the head reads the test metrics and leaves; the run still writes everything."""
    data = make_tiny_data(tmp_path / "data")
    train = subprocess.Popen([sys.executable, TRAIN, "--data-dir", str(data), "--logdir", str(tmp_path / "logs"),
                              *TINY, "--max-epochs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
    first = train.stdout.readline()
    train.stdout.close()  # as head does after its one line
    stderr = train.stderr.read()
    assert train.wait(timeout=HANG_S) in (0, 141), stderr
    assert first.startswith("test/acc") and "Traceback" not in stderr
    run = tmp_path / "logs" / "tiny" / "version_0"
    assert (run / "model.pth").is_file() and (run / "results.json").is_file()


def test_a_model_too_large_for_memory_is_one_line(tmp_path):
    data = make_tiny_data(tmp_path / "data")
    done = finishes("train.py", "--data-dir", str(data), "--logdir", str(tmp_path / "logs"), *TINY, "--hidden",
                    "100000000")
    assert "the model does not fit in memory (292.1 GiB for one tensor); choose smaller options (--hidden " \
           "100000000)" in one_line_error(done.stderr)
    assert not (tmp_path / "logs" / "tiny").exists()


def test_a_resume_skips_what_is_not_its_own_log_and_a_row_cut_short(tmp_path):
    from project.reliability.run_folder import roll_back_logs

    (tmp_path / "events.out.tfevents.bak").write_bytes(b"a user's copy")
    (tmp_path / "metrics.csv").write_text("epoch,step,train/loss\n0,1,0.5\n0,3,0.4\n0,5\n0")
    roll_back_logs(tmp_path, 4)
    assert (tmp_path / "events.out.tfevents.bak").read_bytes() == b"a user's copy"
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["epoch,step,train/loss", "0,1,0.5", "0,3,0.4"]


def test_a_save_that_fails_in_torchs_writer_is_a_write_error(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as ``RuntimeError: ... unexpected pos``: the template's error for a
    failed write (one line, the last good file kept) covers it."""
    from project.reliability import checkpointing

    (tmp_path / "last.ckpt").write_bytes(b"the last good one")

    def failing_save(obj, stream):
        stream.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(checkpointing.torch, "save", failing_save)
    with pytest.raises(OSError, match="write failed"):
        checkpointing.atomic_save({"x": 1}, tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").read_bytes() == b"the last good one" and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("said", ["[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing "
                                  "file data/0: file write failed",
                                  "[enforce fail at inline_container.cc:614] . unexpected pos 64 vs 0"])
@pytest.mark.parametrize(("limit", "free", "error", "meaning"), [
    (200_000, 1 << 30, errno.EFBIG, "File too large: this process may write files of at most 200,000 bytes"),
    (150_000 + (1 << 16), 1 << 30, errno.EFBIG, "File too large: this process may write files of at most 215,536 "
                                                "bytes"),
    (150_000 + (1 << 16) + 1, 1 << 20, errno.EIO, "write failed ([enforce fail at inline_container.cc:"),
    (10_000_000, (1 << 20) - 1, errno.ENOSPC, "No space left on device"),
])
def test_torchs_word_for_a_failed_write_is_read_as_the_failure_it_stands_for(tmp_path, monkeypatch, said, limit,
                                                                             free, error, meaning):
    """A write cut off 150,000 bytes in: within 64 KiB of the file size limit (``ulimit -f``) it is that limit,
    with less than 1 MiB free it is a full disk, otherwise torch's own words; the target is named either way."""
    import resource
    import shutil
    from types import SimpleNamespace

    from project.reliability import checkpointing

    def cut_off(obj, stream):
        stream.write(bytes(150_000))
        raise RuntimeError(said)

    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    monkeypatch.setattr(shutil, "disk_usage", lambda where: SimpleNamespace(free=free))
    monkeypatch.setattr(checkpointing.torch, "save", cut_off)
    target = tmp_path / "last.ckpt"
    with pytest.raises(OSError) as failed:
        checkpointing.atomic_save({"x": 1}, target)
    assert failed.value.errno == error and failed.value.filename == str(target)
    assert failed.value.strerror.startswith(meaning)
    assert list(tmp_path.iterdir()) == []


def test_another_failure_inside_torchs_writer_is_not_taken_for_a_failed_write(tmp_path, monkeypatch):
    from project.reliability import checkpointing

    def unpicklable(obj, stream):
        stream.write(b"partial")
        raise RuntimeError("cannot pickle 'generator' object")

    monkeypatch.setattr(checkpointing.torch, "save", unpicklable)
    with pytest.raises(RuntimeError, match="^cannot pickle 'generator' object$"):
        checkpointing.atomic_save({"x": 1}, tmp_path / "last.ckpt")
    assert list(tmp_path.iterdir()) == []


def test_a_save_is_written_beside_its_target_synced_then_renamed_under_a_name_a_resume_clears(tmp_path, monkeypatch):
    """Folders are made as needed; the file is whole on disk when synced, before the rename; and the temporary
    file a kill would leave is one the next resume removes (``.last.ckpt.XXXX.tmp`` beside ``last.ckpt``)."""
    from project.reliability import checkpointing
    from project.reliability.run_folder import remove_partial_files

    run = tmp_path / "run"
    target = run / "checkpoints" / "last.ckpt"
    events: list[tuple[str, object]] = []
    real_save, real_fsync, real_replace = torch.save, os.fsync, os.replace

    def save(obj, stream):
        events.append(("writing", sorted(p.name for p in target.parent.iterdir())))
        real_save(obj, stream)

    def fsync(descriptor):
        events.append(("synced", os.fstat(descriptor).st_size))
        real_fsync(descriptor)

    def replace(source, destination):
        events.append(("renamed", (Path(source).parent, Path(destination))))
        real_replace(source, destination)

    monkeypatch.setattr(checkpointing.torch, "save", save)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert checkpointing.atomic_save({"w": torch.arange(1000)}, target) == target
    monkeypatch.undo()
    [(writing, [temporary]), (synced, size), (renamed, where)] = events
    assert (writing, synced, renamed) == ("writing", "synced", "renamed")
    assert size == target.stat().st_size and where == (target.parent, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(1000))
    (target.parent / temporary).write_bytes(b"cut short by a kill")
    remove_partial_files(run)
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_runs_started_at_the_same_moment_with_their_own_names_each_keep_theirs(tmp_path):
    """The exclusive mkdir holds for named folders too: of two claims on one name, one is refused."""
    from project.config.schema import RunConfig
    from project.errors import UsageError
    from project.reliability import run_folder
    from project.reliability.run_folder import claim_run_folder

    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def claim() -> None:
        barrier.wait()
        try:
            claim_run_folder(RunConfig(logdir=str(tmp_path), run_version="job_1"))
            outcomes.append("claimed")
        except UsageError as err:
            outcomes.append(str(err))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run_folder.release_all()
    assert len(outcomes) == 2 and outcomes.count("claimed") == 1
    assert "exists; runs never share a folder" in next(o for o in outcomes if o != "claimed")


@pytest.mark.parametrize(("mode", "values", "expected"), [
    ("F", [0.0, 0.5, 1.0], [0, 128, 255]),  # floats in [0, 1]: scaled by 255
    ("F", [0.0, 1.5, 255.0], [0, 2, 255]),  # floats past 1: already 0-255
    ("F", [-3.0, 0.25, 1.0], [0, 64, 255]),  # below 0: clipped, not wrapped
    ("I;16", [0, 32768, 65535], [0, 128, 255]),  # 16-bit: the whole range
    ("I;16B", [0, 257, 65535], [0, 1, 255]),
    ("I", [0, 128, 255], [0, 128, 255]),  # 32-bit integers within 8 bits: kept
    ("I", [0, 256, 65535], [0, 1, 255]),  # past 8 bits: read as 16-bit
    ("I", [0, 128, 256], [0, 0, 1]),  # one past 8 bits is enough
    ("I", [0, 65407, 70000], [0, 255, 255]),  # 65407: 254.502 of 255 (top 65535); past 16 bits: clipped
    ("F", [0.0, 0.5, 1.5], [0, 0, 2]),  # a float just past 1: 0-255 already
    ("I;16", [0, 100, 255], [0, 0, 1]),  # a dark 16-bit image stays dark, whatever its largest value
    ("I;16L", [0, 200, 65407], [0, 1, 255]),
    ("I;16N", [0, 200, 65407], [0, 1, 255]),
])
def test_each_depth_is_scaled_to_8_bits_exactly(mode, values, expected):
    """Against the arithmetic by hand: round(value x 255 / top), top the depth's largest value."""
    from project.results.image_files import eight_bit

    dtype = {"F": np.float32, "I;16": "<u2", "I;16L": "<u2", "I;16N": np.uint16, "I;16B": ">u2", "I": np.int32}[mode]
    image = Image.frombytes(mode, (3, 1), np.array(values, dtype=dtype).tobytes())
    assert image.mode == mode
    converted = eight_bit(image)
    assert converted.mode == "L" and list(converted.tobytes()) == expected


def test_the_files_to_classify_are_those_named_then_each_folders_own_in_order(tmp_path):
    from project.errors import UsageError
    from project.results.image_files import image_files

    folder = tmp_path / "pictures"
    (folder / "sub").mkdir(parents=True)
    for name in ("b.png", "a.png", ".hidden.png", "sub/c.png"):
        (folder / name).write_bytes(b"")
    (tmp_path / "first.png").write_bytes(b"")
    assert image_files([str(tmp_path / "first.png"), str(folder), "missing.png"]) == [
        tmp_path / "first.png", folder / "a.png", folder / "b.png", Path("missing.png")]  # read, or refused, later
    (folder / "a.png").unlink()
    (folder / "b.png").unlink()
    with pytest.raises(UsageError) as refused:
        image_files([str(folder)])  # a hidden file and a subfolder only
    assert str(refused.value) == (f"{folder}: no files in this folder (predict.py reads the files directly in it, "
                                  "not in its subfolders)")


def test_each_reason_an_image_file_cannot_be_used_is_its_own_line(tmp_path):
    from project.results.image_files import with_image

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "notes.png").write_text("not a picture")
    Image.new("L", (64, 64), 90).save(tmp_path / "whole.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:60])
    (tmp_path / "folder.png").mkdir()
    reasons = {"missing.png": "no such file", "folder.png": "is a directory, not a file",
               "pipe": "not a regular file (a pipe or a device)",
               "notes.png": "not an image file (or a format Pillow cannot read)"}
    for name, reason in reasons.items():
        with pytest.raises(ImageError) as refused:
            with_image(tmp_path / name, lambda image: image)
        assert str(refused.value) == reason
    with pytest.raises(ImageError, match=r"^cannot decode the image \(.+\)$"):
        with_image(tmp_path / "cut.png", lambda image: image)
    assert with_image(tmp_path / "whole.png", lambda image: image.getpixel((0, 0))) == 90
