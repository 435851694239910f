"""What a job writes into its output folder, declared once beside the job.

As a NeMo Curator stage declares its `inputs()` and `outputs()`, each job here declares
the files and folders it writes, relative to its `out` folder, with what they hold and,
where cheap, the columns a reader may rely on:

    EVALUATE_OUTPUTS = Outputs(
        report=Output("report.json", "counts, families run and skipped, models"),
        aggregates=Output("aggregates.parquet", "mean, std and interval per system and metric",
                          columns=SCORE_AGGREGATES.names),
        ...)

The job writes `root / EVALUATE_OUTPUTS.aggregates`, and every reader (the study
report, the study plan's check of the paths a step reads from another step's folder,
a downstream job) names the file the same way, so the name is written once. An `Output`
is the name itself (a `str`: `folder / output` and f-strings read exactly as the literal
did); a name with `{field}` is a template the job fills (`.format(name=...)`), one with
`*` several files; `folder=True` marks a folder (a table's part files, a model).

A study job carries its declaration (`StudyJob.outputs`, `pipelines/core/study_registry.py`).
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rexeval.pipelines.core.io import MANIFEST

_FIELD = re.compile(r"\{[^{}]*\}")


class Output(str):
    """One file or folder a job writes, relative to its output folder (see the module
    docstring). Immutable; equal to, and usable as, its relative path."""

    what: str
    columns: tuple[str, ...]
    folder: bool

    def __new__(cls, path: str, what: str = "", *, columns: Iterable[str] = (), folder: bool = False) -> Output:
        if not path or path.startswith("/") or path.endswith("/"):
            raise ValueError(f"an output is a path relative to the job's folder, not {path!r}")
        self = super().__new__(cls, path)
        self.__dict__.update(what=what, columns=tuple(columns), folder=folder)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Output {str(self)!r} is immutable")

    @property
    def name(self) -> str:
        """The last part of the path (a file's name inside its folder)."""
        return self.rpartition("/")[2]

    @property
    def pattern(self) -> str:
        """The glob every file of this output matches (`{field}` -> `*`)."""
        return _FIELD.sub("*", str(self))

    def matches(self, rel: str) -> bool:
        """Whether `rel` (a path relative to the job's folder) is this output, or, for a
        folder, lies inside it."""
        rel = rel.strip("/")
        return fnmatch.fnmatchcase(rel, self.pattern) or (self.folder and fnmatch.fnmatchcase(rel, self.pattern + "/*"))


class Outputs(Mapping[str, Output]):
    """A job's declared outputs: logical name -> `Output`, read as a mapping or by
    attribute (`EVALUATE_OUTPUTS.report`). `a | b` is both declarations."""

    def __init__(self, **files: Output | str):
        for name in files:
            if hasattr(Outputs, name) or name.startswith("_"):
                raise ValueError(f"{name!r} cannot name an output (it is a method of Outputs)")
        self.__dict__["_files"] = {k: v if isinstance(v, Output) else Output(v) for k, v in files.items()}

    def __getattr__(self, name: str) -> Output:
        files = self.__dict__.get("_files", {})
        if name in files:
            return files[name]
        raise AttributeError(f"no output {name!r} is declared (declared: {', '.join(files) or 'none'})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Outputs are immutable")

    def __getitem__(self, name: str) -> Output:
        return self._files[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __or__(self, other: Outputs) -> Outputs:
        return Outputs(**{**self._files, **other._files})

    def __repr__(self) -> str:
        return f"Outputs({', '.join(f'{k}={str(v)!r}' for k, v in self._files.items())})"

    def declares(self, rel: str) -> bool:
        """Whether the path `rel`, relative to the job's folder, is one of its outputs
        (or inside a declared folder)."""
        return any(o.matches(rel) for o in self._files.values())

    def paths(self) -> list[str]:
        """The declared paths, in declaration order (for messages)."""
        return [str(o) for o in self._files.values()]


MANIFEST_OUTPUT = Output(MANIFEST, "the job, its settings, their hash, its counts (every sharded job)")
REPORT_OUTPUT = Output("report.json", "what most jobs report: counts, settings, what they found")
ERRORS_OUTPUT = Output("errors", "rows that could not be processed, with the reason", folder=True)


def table_outputs(*tables: str, manifest: bool = True) -> Outputs:
    """The outputs of a job written with `ShardedOutput`: one folder of part files per
    table (logical name = folder name) and manifest.json."""
    files: dict[str, Output] = {t: (ERRORS_OUTPUT if t == ERRORS_OUTPUT else Output(t, f"the {t} table", folder=True))
                                for t in tables}
    return Outputs(**files, **({"manifest": MANIFEST_OUTPUT} if manifest else {}))
