"""Nothing secret is written anywhere: passwords in URLs are masked before a command line or setting is shown,
logged or saved."""

from __future__ import annotations

import re

# scheme://user:password@host -> scheme://user:***@host (PostgreSQL URLs for sweeps, proxies, ...)
_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<password>\S*)@")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it masked."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:***@", text)
