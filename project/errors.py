"""Every error a user can cause or fix, and how scripts report them: one line instead of a traceback."""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

MASK = "***"
# The userinfo's password: greedy up to the last '@' of the word, so a raw '@' inside the password is masked too.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*):(?P<password>\S*)@")
# A key that names a credential, in a query string (?k=v&k=v) or a DSN (k=v k='v w'); a bare value ends before the
# ':', '.' or ')' of the sentence it stands in, and holds any of them inside.
_SECRET_KEY = (r"[A-Za-z0-9_.\-]*(?:passw(?:or)?d|passphrase|passfile|secret|token|credential|api_?key|private_?key)"
               r"[A-Za-z0-9_.\-]*|pwd|pass")
# Percent-encoded (a URL inside another's query), a key follows an encoded '?' or '&' and its value ends before one.
_KEY_VALUE = re.compile(
    rf"(?P<key>(?:(?<![A-Za-z0-9_.\-%])|(?<=%[0-9A-Fa-f]{{2}}))(?:{_SECRET_KEY}))(?P<sep>\s*=\s*|%3[Dd])"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|(?:(?!%26)[^\s&;,'\"`|])*(?:(?!%26)[^\s&;,'\"`|):.]))",
    re.IGNORECASE,
)


# A scheme as typed, well formed or not: 'postgresql://', 'postgresql:/', 'mysql+pymysql://'.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:/+")
# Short passwords are masked only where a URL's pattern finds them: "pw" alone would mask every "pw" printed.
SHORTEST_HIDDEN = 4
# Texts given to a script that carry a credential the patterns below may not find (a URL with a space in its
# password, one slash, no scheme), each with what is shown instead: filled by ``hide_credentials_of``.
_GIVEN: dict[str, str] = {}


def userinfo_password(text: str) -> str | None:
    """The password of ``[scheme:/+]user:password@host...``, however malformed: everything between the userinfo's
    first ':' and the text's last '@'."""
    if "@" not in text:
        return None
    head = text[: text.rindex("@")]
    userinfo = _SCHEME.sub("", head, count=1)
    if ":" not in userinfo and "://" not in head:  # "user:/pw@host": no scheme, a password starting with '/'
        userinfo = head
    _, colon, password = userinfo.partition(":")
    return password if colon and password else None


def hide_credentials_of(text: str) -> None:
    """Remember a value a script was given (a storage URL, a data folder), so that every later ``redact`` masks
    its password wherever it appears, whatever the URL's shape: a space in the password, ``postgresql:/``, no
    scheme at all."""
    password = userinfo_password(text)
    if password:
        at = text.rindex("@")
        _GIVEN[text] = text[: at - len(password)] + MASK + text[at:]
        if len(password) >= SHORTEST_HIDDEN:
            _GIVEN[password] = MASK


def redact(text: str) -> str:
    """``text`` with every credential in it replaced by ``***``."""
    for given in sorted(_GIVEN, key=len, reverse=True):  # a whole value before the password inside it
        text = text.replace(given, _GIVEN[given])
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    return _KEY_VALUE.sub(lambda m: f"{m.group('key')}{m.group('sep')}{MASK}", text)


def redact_values(value: Any) -> Any:
    """A mapping, list or string (as written to a JSON or YAML file) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_values(item) for item in value)
    return value


class UserError(Exception):
    """A mistake the user can fix (bad flag, missing file); reported without a traceback."""

    exit_code = 1


class UsageError(UserError):
    """A bad command-line request, reported like argparse does (exit code 2)."""

    exit_code = 2


class Terminated(UserError):
    """The run got SIGTERM (a scheduler's pre-emption, ``kill``) or Ctrl-C; its state was saved first. A stop that
    was asked for is not an error: its line says what stopped it and where, after the script's name alone (its exit
    status is still a signal's, for the scheduler or shell that waits on it)."""

    exit_code = 128 + 15
    prefix = ""
    said = False  # its line is on stderr already (said before the process could be ended)


class NothingToDo(UserError):
    """The request is already met (resuming a finished run); said in one line, exit status 0."""

    exit_code = 0


class DataError(UserError):
    """The data files are missing, unreadable or do not fit the recipe."""


class CheckpointError(UserError):
    """A checkpoint or weights file that is missing, corrupt or from something else."""


class NonFiniteLossError(UserError):
    """Training diverged; raised so that no checkpoint of the broken weights is written."""


class ImageError(UserError):
    """A file the recipe cannot read as an input (not an image, unreadable, nothing in it)."""


ONE_LINE = 200  # characters of an error's message that a one-line report quotes


def first_line(err: BaseException | str, limit: int = ONE_LINE) -> str:
    """The first line of an error's message, at most ``limit`` characters; its type's name when it says nothing."""
    text = str(err).strip()
    if not text:
        return type(err).__name__ if isinstance(err, BaseException) else ""
    return text.splitlines()[0][:limit]


def not_a_regular_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file, where something is there: a folder, a link to nothing, or a pipe or
    device whose read would block for good. None for a regular file, or for nothing at all (each reader says
    'missing' its own way)."""
    if path.is_dir():
        return "is a directory, not a file"
    if path.is_symlink() and not path.exists():
        return "a symbolic link that leads nowhere (its target is missing, or links loop)"
    if path.exists() and not path.is_file():
        return "not a regular file (a pipe or a device)"
    return None


def _quiet_write_failures(args: threading.ExceptHookArgs) -> None:
    """A helper thread's failed write (TensorBoard's writer, the figures) reaches the main thread, which says
    it in one line; the thread's own traceback would only repeat it."""
    if not issubclass(args.exc_type, OSError):
        threading.__excepthook__(args)


def run_cli(main: Callable[[], int | None], prog: str, debug: bool = False) -> NoReturn:
    """Run a script's ``main``, turning ``UserError`` into one line on stderr (``debug``: the traceback too)."""
    if not debug:
        threading.excepthook = _quiet_write_failures
    try:
        code = main()
        # Leave torch's and Lightning's large object graph out of the collection Python runs at
        # exit (about a second here); objects are still finalised, files still flushed.
        gc.freeze()
    except UserError as err:
        if debug:
            print(redact(traceback.format_exc()).rstrip(), file=sys.stderr)
        # Every rank of a DDP job stops on SIGTERM; the rank that was started first says so.
        if not getattr(err, "said", False) and \
                not (isinstance(err, (Terminated, NothingToDo)) and os.environ.get("LOCAL_RANK", "0") != "0"):
            prefix = getattr(err, "prefix", "error: ") if err.exit_code else ""
            print(f"{prog}: {prefix}{terminal_safe(redact(str(err)))}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # `script | head`: whoever read stdout has gone; nothing to say, nowhere to say it
        stdout_gone()
        sys.exit(128 + 13)
    sys.exit(code or 0)


def stdout_gone() -> None:
    """Point stdout at /dev/null once its reader has gone, so that later prints (and the interpreter's flush at
    exit) do not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def say(text: str) -> None:
    """Print a result line (credentials masked, control characters escaped); a reader that went away
    (``train.py | head -1``) stops no run: the rest is in files."""
    try:
        print(terminal_safe(redact(text)), flush=True)
    except BrokenPipeError:
        stdout_gone()


# C0 and C1 control characters and DEL: in a name or a record they could move the cursor, clear the screen or
# retitle the terminal that shows them.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | \
    {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"}
_LAYOUT = {ord("\n"), ord("\t")}


def terminal_safe(text: str) -> str:
    """``text`` with every control character escaped but the newlines and tabs that lay it out."""
    return text.translate({code: escape for code, escape in _CONTROLS.items() if code not in _LAYOUT})


def one_field(text: str) -> str:
    """``text`` as one field of one line (a table's cell, a tab-separated row): backslashes and every control
    character escaped, so that the line reads back as it was."""
    return text.replace("\\", "\\\\").translate(_CONTROLS)
