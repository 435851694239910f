"""Why a Ray actor, task or Serve replica failed, in one line a user can act on.

Ray reports a worker's failure as the whole remote traceback inside its own exception's
message ("The actor died because of an error raised in its creation task, ... Traceback
... rexeval.models.refs.PackageNotInstalled: model ... Install it with: ..."), and Serve
as "Failed to update the deployments [...]" with the replica's traceback only in its
status. The reason a user needs is the traceback's last exception line; these helpers
find it, and the errors below carry it to the commands, which print it as one line.
"""
from __future__ import annotations

import re

_FRAME = re.compile(r"^\s+File \"")
_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?:\([\w.]+\))?: (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_CHARS = 400
_CHAIN_STARTS = ("Traceback (most recent call last)", "During handling", "The above exception", "ray::")


class WorkerFailed(RuntimeError):
    """A Ray actor or task of a job failed (its model could not load, its code raised)."""


class AwaitingRerun(RuntimeError):
    """A job ended with rows whose LLM calls failed in transport (a connection, a 5xx,
    a dead replica, after the retries): nothing was recorded for them, their shards are
    not done, and a plain re-run of the same command does them. Exit code 75."""

    exit_code = 75  # EX_TEMPFAIL: try again later

    def __init__(self, message: str, awaiting: int = 0, counts: dict | None = None):
        super().__init__(message)
        self.awaiting, self.counts = awaiting, counts or {}


class ServeStartFailed(RuntimeError):
    """A Serve application's replicas could not start."""


def last_exception_line(text: str) -> str | None:
    """"Type: message" of the last exception in a traceback's text (the type without its
    module path, the message's continuation lines joined), or None when there is none."""
    lines = _ANSI.sub("", text).splitlines()
    last_frame = max((i for i, line in enumerate(lines) if _FRAME.match(line)), default=-1)
    for i in range(last_frame + 1, len(lines)):
        m = _EXCEPTION.match(lines[i])
        if m and not lines[i].startswith(" "):
            rest = [m.group(2).strip()]
            for more in lines[i + 1:]:
                if more.startswith(_CHAIN_STARTS):  # the next exception of a chain
                    break
                rest.append(more.strip())
            message = " ".join(p for p in rest if p)
            line = f"{m.group(1).rsplit('.', 1)[-1]}: {message}"
            return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."
    return None


def reason_of(exc: BaseException) -> str:
    """One line for `exc`: the last exception of the remote traceback a Ray error
    carries in its message, else the exception itself (its first line)."""
    found = last_exception_line(str(exc))
    if found:
        return found
    cause = getattr(exc, "cause", None)  # RayTaskError: the remote exception
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"
