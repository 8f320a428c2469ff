"""How every script ends (``run_cli``), in process: each kind of error is one line on stderr with its exit status,
credentials masked and control characters escaped; an interrupt, a reader gone away and a result printed before
the process is ended each as a user reads them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from helpers import HANG_S, ROOT
from project import errors
from project.errors import (
    CheckpointError,
    DataError,
    NothingToDo,
    Terminated,
    UsageError,
    UserError,
    first_line,
    run_cli,
    say,
)


def ended(main, capsys, debug: bool = False) -> tuple[int, str, str]:
    """The exit status and the streams of ``run_cli(main)``."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, "tool.py", debug=True) if debug else run_cli(main, "tool.py")  # no traceback unless asked
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def raising(error: BaseException):
    def main() -> int:
        raise error
    return main


@pytest.mark.parametrize(("error", "code", "line"), [
    (UserError("no such file: x"), 1, "tool.py: error: no such file: x"),
    (UsageError("--lr: must be above 0"), 2, "tool.py: error: --lr: must be above 0"),
    (DataError("data/: empty"), 1, "tool.py: error: data/: empty"),
    (CheckpointError("a.ckpt: truncated"), 1, "tool.py: error: a.ckpt: truncated"),
    (Terminated("stopped by SIGTERM after step 4"), 143, "tool.py: stopped by SIGTERM after step 4"),  # no error
    (NothingToDo("the run is finished"), 0, "tool.py: the run is finished"),
], ids=["user", "usage", "data", "checkpoint", "terminated", "nothing-to-do"])
def test_each_kind_of_error_is_one_line_with_its_exit_status(capsys, error, code, line):
    status, out, err = ended(raising(error), capsys)
    assert (status, out, err) == (code, "", line + "\n")


def test_a_stop_asked_for_has_no_error_prefix_and_a_line_said_already_is_not_repeated(capsys):
    asked = Terminated("stopped by SIGUSR1 after step 4; requeueing job 7")
    assert ended(raising(asked), capsys) == (143, "", "tool.py: stopped by SIGUSR1 after step 4; requeueing job 7\n")
    failed = Terminated("requeueing job 7 failed (denied): submit it again to continue")
    failed.prefix = "error: "  # a stop whose requeue failed
    assert ended(raising(failed), capsys) == (143, "", "tool.py: error: requeueing job 7 failed (denied): submit it "
                                                       "again to continue\n")
    said = Terminated("stopped")
    said.said = True
    assert ended(raising(said), capsys) == (143, "", "")


@pytest.mark.parametrize("error", [Terminated("stopped by SIGTERM"), NothingToDo("finished")])
def test_only_the_first_rank_says_how_every_rank_stopped(capsys, monkeypatch, error):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert ended(raising(error), capsys) == (error.exit_code, "", "")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert ended(raising(error), capsys)[2].count("\n") == 1
    assert ended(raising(UsageError("bad")), capsys)[2] == "tool.py: error: bad\n"  # a rank's own error: said


def test_the_line_masks_credentials_and_escapes_control_characters(capsys):
    error = UsageError("--storage postgresql://me:hunter2@db/optuna: \x1b]0;owned\x07 refused\nmore")
    status, _, err = ended(raising(error), capsys)
    assert status == 2 and "hunter2" not in err and "\x1b" not in err and "\x07" not in err
    assert err == "tool.py: error: --storage postgresql://me:***@db/optuna: \\x1b]0;owned\\x07 refused\nmore\n"


def test_debug_adds_the_traceback_masked(capsys):
    status, _, err = ended(raising(UsageError("postgresql://me:hunter2@db")), capsys, debug=True)
    assert status == 2 and err.startswith("Traceback (most recent call last)") and "hunter2" not in err
    assert err.splitlines()[-2:] == ["project.errors.UsageError: postgresql://me:***@db",
                                     "tool.py: error: postgresql://me:***@db"]


@pytest.mark.parametrize(("returned", "code"), [(None, 0), (0, 0), (3, 3)])
def test_main_returns_its_exit_status(capsys, returned, code):
    assert ended(lambda: returned, capsys) == (code, "", "")


def test_ctrl_c_outside_a_run_is_one_line_and_130(capsys):
    assert ended(raising(KeyboardInterrupt()), capsys) == (130, "", "tool.py: interrupted\n")


def test_an_error_not_the_users_keeps_its_traceback(capsys):
    with pytest.raises(ZeroDivisionError):
        run_cli(raising(ZeroDivisionError("a bug")), "tool.py")


def test_a_helper_threads_failed_write_is_left_to_the_main_threads_line(capsys):
    original = threading.excepthook
    try:
        threading.excepthook = threading.__excepthook__
        ended(lambda: 0, capsys)
        assert threading.excepthook is not threading.__excepthook__
        for error in (OSError("No space left on device"), ValueError("a bug")):
            thread = threading.Thread(target=raising(error))
            thread.start()
            thread.join()
        err = capsys.readouterr().err
        assert "No space left" not in err and "ValueError: a bug" in err  # a bug in a thread still shows
        threading.excepthook = threading.__excepthook__
        ended(lambda: 0, capsys, debug=True)
        assert threading.excepthook is threading.__excepthook__  # --debug: every thread's traceback
    finally:
        threading.excepthook = original


def script_output(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_reader_gone_away_ends_the_script_quietly_with_sigpipes_status():
    """``script | head``: the script ends at its next print, silent, with SIGPIPE's status (``say`` goes on)."""
    printing = ("from project.errors import run_cli\n"
                "def main():\n    [print(str(i % 10) * 100) for i in range(100000)]\nrun_cli(main, \"tool.py\")")
    done = subprocess.run(f"{sys.executable} -c '{printing}' | head -c 10; echo \" ${{PIPESTATUS[0]}}\"",
                          shell=True, capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, executable="/bin/bash")
    assert (done.stdout, done.stderr) == ("0" * 10 + f" {128 + 13}\n", "")


def test_a_reader_gone_away_in_process(capsys, monkeypatch):
    gone: list[bool] = []
    monkeypatch.setattr(errors, "stdout_gone", lambda: gone.append(True))  # its own effect: the subprocess test
    assert ended(raising(BrokenPipeError()), capsys) == (128 + 13, "", "") and gone == [True]


def test_say_flushes_each_result(monkeypatch):
    class Recording(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1
            super().flush()

    stdout = Recording()
    monkeypatch.setattr(sys, "stdout", stdout)
    say("test/acc 0.98 postgresql://me:hunter2@db \x1b[2J")
    assert stdout.getvalue() == "test/acc 0.98 postgresql://me:***@db \\x1b[2J\n" and stdout.flushes == 1


def test_a_result_said_is_on_stdout_even_if_the_process_is_ended_at_once():
    """``say`` flushes: a result printed before a crash or a kill is not lost in a pipe's buffer."""
    done = script_output("from project.errors import say; import os; say('test/acc 0.98'); os._exit(3)")
    assert (done.returncode, done.stdout) == (3, "test/acc 0.98\n")


def test_first_line_of_an_empty_message_is_the_errors_type_and_of_empty_text_nothing():
    assert first_line(ValueError()) == "ValueError"
    assert first_line("") == "" and first_line("  \n ") == ""
    assert first_line("one\ntwo") == "one" and first_line("x" * 300) == "x" * 200
    assert first_line(OSError("disk\nfull"), limit=3) == "dis"
