"""Processes that must not outlive the one that started them (DDP ranks, sweep workers)."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before that took effect
        os.kill(os.getpid(), signal.SIGKILL)
