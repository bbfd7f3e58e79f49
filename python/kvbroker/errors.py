# SPDX-License-Identifier: MIT
"""kvbroker's exceptions: every -errno of libkvbroker becomes an Error."""
from __future__ import annotations

import errno as _errno
import os
from typing import List, Optional


def strerror(status: int) -> str:
    """libkvbroker's text for a status (0 or -errno); os.strerror without the library."""
    if status == 0:
        return "success"
    try:
        from ._lib import load

        s = load().kvb_strerror(status)
        if s:
            return s.decode("utf-8", "replace")
    except Exception:  # no library: the system's text will do
        pass
    return os.strerror(-status if status < 0 else status)


class Error(OSError):
    """A failed libkvbroker call.

    ``errno`` is the positive error number (``errno.EPIPE`` ...), ``strerror``
    libkvbroker's text for it, ``call`` the C function (``"kvb_attach"``).
    """

    def __init__(self, err: int, text: Optional[str] = None, call: str = ""):
        err = abs(err)
        super().__init__(err, text if text is not None else strerror(-err))
        self.call = call

    def __str__(self) -> str:
        where = f"{self.call}: " if self.call else ""
        name = _errno.errorcode.get(self.errno, str(self.errno))
        return f"{where}{self.strerror} ({name})"

    def __reduce__(self):
        return (type(self), (self.errno, self.strerror, self.call))


class BrokerGone(Error):
    """EPIPE: the broker went away (every later call fails the same)."""


class RingFull(Error):
    """EAGAIN from seal() or abort(): the submission ring is full.

    Reap completions (poll / wait) and try again. The submit_* calls do not
    raise it: they return how many descriptors were queued, 0 when none fit.
    """


class LibraryNotFound(Error):
    """No libkvbroker could be loaded. ``tried`` lists each place and why."""

    def __init__(self, tried: List[str], text: Optional[str] = None, call: str = "load"):
        if isinstance(tried, int):  # unpickling: (errno, text, call)
            super().__init__(tried, text, call)
            self.tried = []
            return
        self.tried = list(tried)
        msg = "libkvbroker not found; tried:\n  " + "\n  ".join(self.tried)
        msg += "\n(set KVBROKER_LIB to the library's path)"
        super().__init__(_errno.ENOENT, msg, call)


def check(rc: int, call: str) -> int:
    """rc when >= 0; else raise the matching Error."""
    if rc >= 0:
        return rc
    raise error(rc, call)


def error(rc: int, call: str) -> Error:
    """The Error for status rc (-errno), of the most precise class."""
    if rc == -_errno.EPIPE:
        return BrokerGone(_errno.EPIPE, None, call)
    if rc == -_errno.EAGAIN:
        return RingFull(_errno.EAGAIN, None, call)
    return Error(rc, None, call)
