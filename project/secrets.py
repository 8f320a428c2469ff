"""Nothing secret is written anywhere: every URL, DSN or setting the project prints or stores goes through ``redact``
first (stdout, stderr, run records, configs, results, TensorBoard, a sweep's report).

A storage URL can carry a password in its userinfo (``scheme://user:pw@host``, ``scheme://:pw@host``), in its query
(``?password=...&sslpassword=...``) or, as a libpq DSN, as ``password=...`` words; SQLAlchemy URLs for PostgreSQL,
MySQL and the rest take the same forms. Imports nothing: the lowest layer uses it.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# The userinfo's password: greedy up to the last '@' of the word, so a raw '@' inside the password is masked too.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*):(?P<password>\S*)@")
# A key that names a credential, in a query string (?k=v&k=v) or a DSN (k=v k='v w'); a bare value ends before the
# ':', '.' or ')' of the sentence it stands in, and holds any of them inside.
_SECRET_KEY = (r"[A-Za-z0-9_.\-]*(?:passw(?:or)?d|passphrase|passfile|secret|token|credential|api_?key|private_?key)"
               r"[A-Za-z0-9_.\-]*|pwd|pass")
_KEY_VALUE = re.compile(
    rf"(?P<key>(?<![A-Za-z0-9_.\-])(?:{_SECRET_KEY}))(?P<sep>\s*=\s*|%3[Dd])"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"`|]*[^\s&;,'\"`|):.])",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every credential in it replaced by ``***``."""
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
