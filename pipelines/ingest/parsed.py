"""One parse task's result before validation: raw field columns as strings, the line
of each row, and the rows that could not be read at all (error rows already), with the
small helpers every reader of a review file shares."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

STAGE = "ingest"
RAW_LIMIT = 65_536
"""Characters of an input row kept in an error row's `raw` (a 5 MB line is named, not copied)."""


class ParsedChunk:
    """Raw field columns (strings) with their lines and raw text, plus early errors."""

    def __init__(self, source: str):
        self.source = source
        self.errors: list[dict] = []
        self.columns: dict[str, pa.Array] = {}
        self.lines = np.zeros(0, dtype=np.int64)
        self.raw: list[str] | None = None  # raw row text, aligned with lines
        self.records = 0  # rows seen (blank lines excluded)
        self.stopped: list[tuple[int, str]] = []  # (line, why) where reading ended early

    def error(self, line: int | None, error_type: str, message: str, raw: str | None = None,
              field: str | None = None) -> None:
        self.errors.append({"source": self.source, "line": line, "field": field,
                            "error_type": error_type, "message": one_line(message), "raw": clip(raw)})

    def stop(self, line: int, why: str) -> None:
        """Note that reading ended early at `line` (the first line not read as rows)."""
        self.stopped.append((line, why))

    def finish(self) -> None:
        """Turn the early ends noted into ONE error row at the first of them (it counts
        as one row in), so in = out + errors holds for a damaged file too."""
        if not self.stopped:
            return
        line = min(at for at, _ in self.stopped)
        whys = "; ".join(why for _, why in sorted(self.stopped))
        self.records += 1
        self.error(line, "read_stopped",
                   f"{self.source}: reading stopped at line {line}: {whys}; the rows before it "
                   "were kept (repair or re-download the file, then ingest it again to read the rest)")
        self.stopped = []


def one_line(message) -> str:
    """An error message on one line (an exception's text may hold line ends)."""
    text = str(message)
    return " ".join(text.split()) if "\n" in text or "\r" in text else text


def clip(raw: str | None) -> str | None:
    """`raw` cut to `RAW_LIMIT` characters, saying how long it was."""
    if raw is None or len(raw) <= RAW_LIMIT:
        return raw
    return f"{raw[:RAW_LIMIT]}... [{len(raw):,} characters in all]"


def has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True
