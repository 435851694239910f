"""ExpScore end to end (seed 003): rated explanations -> factors -> trained heads -> report;
and a trained model -> scores of new explanations.

Inputs. Explanation tables as Parquet (a file or a folder of parts), CSV (with a header)
or JSON lines, one explanation per row, with columns named in the config: the text, the
item id, the human rating (training; optional when scoring, then reported against) and,
optionally, an example id and the item's feature words (a list, a JSON array string,
or words separated by ";"). The item's reviews (for relevance, REL) come from a REVIEWS
table (`rexeval ingest` output or a Parquet file) or from a column holding them. The
word-importance corpus (WI) is every review text given; it is saved with the model and
reused when scoring, so a factor means the same thing at training and scoring time.

Nothing is lost: a row that cannot be used (no text, no words, a rating off the scale or
not a number, features that are not strings, an item without reviews, a repeated
example id, a factor that came out undefined) is written to `errors.parquet` (ERRORS)
naming the file, the row (1-based: the line of a JSON-lines file, the record number of
a CSV or Parquet file) and the field; every other row is in `scores.parquet`.

Grammar (GC) needs LanguageTool, which no package registry ships (its Java server is a
separate ~200 MB download). Give a running server's URL or an unpacked LanguageTool
folder with `languagetool` / `$REXEVAL_LANGUAGETOOL`; without one GC is *unavailable*:
the heads are trained and scored without it and the report says so.

Factors are computed by one Stage (`FactorStage`), in process for small inputs and on a
Ray Data actor pool for large ones (`ray: auto` switches at `ray_min_rows`). The math
lives in `metrics.expscore_factors` and `models.expscore`.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from metrics.expscore_factors import (
    FACTOR_NAMES,
    FACTORS,
    factor_table,
    term_frequencies,
    words,
)
from models.expscore import HEADS, ExpScoreModel, TrainSettings, train_head
from pipelines.io import (
    ShardedOutput,
    read_table,
    write_json_atomic,
    write_parquet_atomic,
)
from pipelines.schema import error_rows
from pipelines.stage import Resources, Stage

STAGE = "expscore"
LANGUAGETOOL_ENV = "REXEVAL_LANGUAGETOOL"
FACTORS_JSON = "factors.json"
ENCODER_ROLE = "sts"  # sentence similarity role: all-MiniLM-L6-v2 (sentence-BERT) in both profiles
ONE_CPU = Resources(cpus=1)

SCORES_SCHEMA = pa.schema(
    [pa.field("example_id", pa.string(), nullable=False), pa.field("source", pa.string()),
     pa.field("line", pa.int64()), pa.field("split", pa.string(), nullable=False),
     pa.field("item_id", pa.string(), nullable=False), pa.field("rating", pa.float64())]
    + [pa.field(f, pa.float64()) for f in FACTORS]
    + [pa.field(f"expscore_{h}", pa.float64()) for h in HEADS])


# ================================================================== settings


class _Inputs(BaseModel):
    """Where explanations, reviews and the grammar checker come from."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(description="explanation tables: Parquet, CSV or JSON lines")
    out: str
    reviews: str | None = Field(None, description="REVIEWS table or `rexeval ingest` folder")
    reviews_column: str | None = Field(None, description="input column with the item's reviews")
    text_column: str = "explanation"
    item_column: str = "item_id"
    rating_column: str = "rating"
    id_column: str = "example_id"
    features_column: str = "features"
    languagetool: str | None = Field(None, description="LanguageTool server URL or folder")
    language: str = "en-US"
    max_reviews_per_item: int = Field(50, ge=1)
    profile: str = "local"
    embedder: str | None = Field(None, description=f"sentence encoder (default: the profile's {ENCODER_ROLE})")
    device: str = "auto"
    ray: Literal["auto", "always", "never"] = "auto"
    ray_min_rows: int = Field(20000, ge=1)
    batch_size: int = Field(512, ge=1)


class ExpScoreTrainConfig(_Inputs):
    """Settings of `rexeval expscore train`."""

    head: Literal["linear", "logistic", "nn", "all"] = "all"
    test_fraction: float = Field(0.2, ge=0, lt=1)
    seed: int = 0
    l2: float = Field(0.01, ge=0)
    lr: float = Field(0.01, gt=0)
    max_epochs: int = Field(5000, ge=1)
    patience: int = Field(50, ge=1)
    rating_min: int = 1
    rating_max: int = 5
    repetition_n: int = Field(2, ge=1)

    def train_settings(self) -> TrainSettings:
        return TrainSettings(l2=self.l2, lr=self.lr, max_epochs=self.max_epochs, patience=self.patience,
                             seed=self.seed, rating_min=self.rating_min, rating_max=self.rating_max)


class ExpScoreScoreConfig(_Inputs):
    """Settings of `rexeval expscore score`."""

    model: str = Field(description="model folder written by `rexeval expscore train`")
    head: Literal["linear", "logistic", "nn", "all"] = "all"


def heads_of(head: str) -> list[str]:
    return list(HEADS) if head == "all" else [head]


# ================================================================== reading rows


def _cell(value: Any) -> Any:
    """A table cell as a plain Python value (NaN / NA -> None)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    try:
        if pd.isna(value) is True:
            return None
    except (TypeError, ValueError):
        pass
    return value.item() if isinstance(value, np.generic) else value


def read_rows(path: str | Path) -> tuple[list[dict], list[dict], list[str]]:
    """(rows, error rows, column names) of one explanation file. Each row carries
    `_source` and `_line`; a JSON-lines line that is not a JSON object is an error row."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such input: {p}")
    rows: list[dict] = []
    errors: list[dict] = []
    if p.is_dir() or p.suffix == ".parquet":
        frame = pd.concat([pd.read_parquet(f) for f in _parquet_files(p)], ignore_index=True)
    elif p.suffix in (".jsonl", ".json"):
        columns: dict[str, None] = {}
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                errors.append(_error(str(p), n, None, None, "bad_json", f"not JSON: {exc.msg}", line))
                continue
            if not isinstance(obj, dict):
                errors.append(_error(str(p), n, None, None, "bad_json", "expected a JSON object", line))
                continue
            columns.update(dict.fromkeys(obj))
            rows.append({**obj, "_source": str(p), "_line": n})
        return rows, errors, list(columns)
    elif p.suffix == ".csv":
        frame = pd.read_csv(p, dtype=str, keep_default_na=False, na_values=[""])
    else:
        raise ValueError(f"{p}: unknown input format (use .parquet, a folder of Parquet parts, .csv or .jsonl)")
    for n, rec in enumerate(frame.to_dict("records"), start=1):
        rows.append({**{k: _cell(v) for k, v in rec.items()}, "_source": str(p), "_line": n})
    return rows, errors, [str(c) for c in frame.columns]


def _parquet_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p]
    files = sorted(f for f in p.glob("*.parquet") if not f.name.startswith("."))
    if not files:
        raise FileNotFoundError(f"{p}: no Parquet parts in this folder")
    return files


def _error(source: str | None, line: int | None, row_id: str | None, field: str | None, kind: str,
           message: str, raw: Any = None) -> dict:
    raw_text = raw if isinstance(raw, str) or raw is None else json.dumps(raw, default=str)[:2000]
    return {"source": source, "line": line, "row_id": row_id, "field": field, "error_type": kind,
            "message": message, "raw": raw_text}


def parse_list(value: Any) -> list[str] | None:
    """A list of strings from a cell: a list, a JSON array string, or "a; b" text.
    None when the value cannot be one."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                return None
        else:
            return [s.strip() for s in text.split(";") if s.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v for v in value if v.strip()]
    return None


def validate_row(raw: dict, cfg: _Inputs, rating: Literal["required", "optional"],
                 scale: tuple[float, float] = (1, 5)) -> tuple[dict | None, dict | None]:
    """(clean row, None) or (None, error row) for one input row; ratings must lie in `scale`."""
    src, line = raw.get("_source"), raw.get("_line")
    rid = raw.get(cfg.id_column)
    row_id = str(rid) if rid is not None and str(rid).strip() else f"{Path(str(src)).name}:{line}"
    clean_raw = {k: v for k, v in raw.items() if not k.startswith("_")}

    def fail(field: str, kind: str, message: str):
        return None, _error(src, line, row_id, field, kind, message, clean_raw)

    text = raw.get(cfg.text_column)
    if not isinstance(text, str) or not text.strip():
        return fail(cfg.text_column, "missing_text", "the explanation is missing or empty")
    if not words(text):
        return fail(cfg.text_column, "no_words", "the explanation has no words")
    item = raw.get(cfg.item_column)
    if item is None or not str(item).strip():
        return fail(cfg.item_column, "missing_item", "the item id is missing")
    value = raw.get(cfg.rating_column)
    label = None
    if value is None:
        if rating == "required":
            return fail(cfg.rating_column, "missing_rating", "the human rating is missing")
    else:
        try:
            label = float(value)
        except (TypeError, ValueError):
            return fail(cfg.rating_column, "bad_rating", f"the rating {value!r} is not a number")
        lo, hi = scale
        if not math.isfinite(label) or not lo <= label <= hi:
            return fail(cfg.rating_column, "bad_rating", f"the rating {value!r} is outside {lo}..{hi}")
    features = parse_list(raw.get(cfg.features_column))
    if features is None:
        return fail(cfg.features_column, "bad_features",
                    "features must be a list of strings, a JSON array of strings, or text separated by ';'")
    row = {"example_id": row_id, "source": src, "line": line, "explanation": text, "item_id": str(item),
           "rating": label, "features": features}
    if cfg.reviews_column:
        reviews = raw.get(cfg.reviews_column)
        reviews = [reviews] if isinstance(reviews, str) else parse_list(reviews)
        if reviews is None:
            return fail(cfg.reviews_column, "bad_reviews", "reviews must be a text or a list of texts")
        row["item_reviews"] = [r for r in reviews if r.strip()]
    return row, None


def load_examples(cfg: _Inputs, rating: Literal["required", "optional"],
                  scale: tuple[float, float] = (1, 5)) -> tuple[list[dict], list[dict], bool]:
    """Valid rows, error rows, and whether any input has the features column."""
    if not cfg.inputs:
        raise ValueError("no input files given")
    if not cfg.reviews and not cfg.reviews_column:
        raise ValueError("give the item reviews: a reviews table (reviews) or an input column (reviews_column)")
    rows, errors, has_features, seen = [], [], False, set()
    for path in cfg.inputs:
        raw_rows, errs, columns = read_rows(path)
        errors += errs
        for col in (cfg.text_column, cfg.item_column):
            if raw_rows and col not in columns:
                raise ValueError(f"{path}: no column {col!r} (columns: {', '.join(columns)}); "
                                 "set the column names in the config or flags")
        if rating == "required" and raw_rows and cfg.rating_column not in columns:
            raise ValueError(f"{path}: no rating column {cfg.rating_column!r} (columns: {', '.join(columns)})")
        if cfg.reviews_column and raw_rows and cfg.reviews_column not in columns:
            raise ValueError(f"{path}: no reviews column {cfg.reviews_column!r}")
        has_features = has_features or cfg.features_column in columns
        for raw in raw_rows:
            row, err = validate_row(raw, cfg, rating, scale)
            if err is None and row["example_id"] in seen:
                err = _error(row["source"], row["line"], row["example_id"], cfg.id_column, "duplicate_id",
                             f"example id {row['example_id']!r} was already used by an earlier row",
                             {k: v for k, v in raw.items() if not k.startswith("_")})
                row = None
            if err is not None:
                errors.append(err)
            else:
                seen.add(row["example_id"])
                rows.append(row)
    return rows, errors, has_features


def read_reviews(path: str | Path) -> pa.Table:
    """item_id, text of a REVIEWS table (a Parquet file, a folder of parts, or an ingest folder)."""
    p = Path(path)
    if (p / "reviews").is_dir():
        p = p / "reviews"
    return read_table(p, "reviews", columns=["review_id", "item_id", "text"])


def reviews_by_item(table: pa.Table, items: set[str], cap: int) -> dict[str, list[str]]:
    """Up to `cap` review texts per wanted item, in review_id order (deterministic)."""
    frame = table.to_pandas()
    frame = frame[frame["item_id"].isin(items) & frame["text"].str.strip().astype(bool)]
    frame = frame.sort_values(["item_id", "review_id"], kind="stable")
    return {item: grp["text"].tolist()[:cap] for item, grp in frame.groupby("item_id", sort=True)}


def attach_reviews(rows: list[dict], cfg: _Inputs) -> tuple[list[dict], list[dict], list[str], dict[str, list[str]]]:
    """Rows that have item reviews, error rows for those that do not, the WI corpus,
    and the reviews per item (empty in column mode, where rows carry their own)."""
    kept, errors = [], []
    if cfg.reviews_column:
        corpus = sorted({r for row in rows for r in row["item_reviews"]})
        by_item: dict[str, list[str]] = {}
        for row in rows:
            row["item_reviews"] = row["item_reviews"][: cfg.max_reviews_per_item]
            if row["item_reviews"]:
                kept.append(row)
            else:
                errors.append(_error(row["source"], row["line"], row["example_id"], cfg.reviews_column,
                                     "no_reviews", "the row has no item reviews (relevance needs them)"))
        return kept, errors, corpus, by_item
    table = read_reviews(cfg.reviews)
    corpus = [t for t in table.column("text").to_pylist() if t]
    by_item = reviews_by_item(table, {r["item_id"] for r in rows}, cfg.max_reviews_per_item)
    for row in rows:
        if by_item.get(row["item_id"]):
            kept.append(row)
        else:
            errors.append(_error(row["source"], row["line"], row["example_id"], cfg.item_column, "no_reviews",
                                 f"item {row['item_id']!r} has no reviews in {cfg.reviews} (relevance needs them)"))
    return kept, errors, corpus, by_item


# ================================================================== grammar checker


class LanguageToolClient:
    """Counts LanguageTool matches per text through its HTTP API (`/v2/check`)."""

    def __init__(self, url: str, language: str = "en-US", timeout: float = 60.0, transport=None):
        import httpx

        self.url = url.rstrip("/")
        self.url = self.url.removesuffix("/v2")
        self.language = language
        self.client = httpx.Client(timeout=timeout, transport=transport)

    def ping(self) -> None:
        """Raise ValueError when no LanguageTool answers at the URL."""
        import httpx

        try:
            self.client.get(f"{self.url}/v2/languages").raise_for_status()
        except httpx.HTTPError as exc:
            raise ValueError(f"no LanguageTool server answers at {self.url}: {exc}") from None

    def count_errors(self, texts: Sequence[str]) -> list[int]:
        out = []
        for text in texts:
            resp = self.client.post(f"{self.url}/v2/check", data={"text": text, "language": self.language})
            resp.raise_for_status()
            out.append(len(resp.json().get("matches") or []))
        return out

    def __getstate__(self):  # picklable for Ray actors: rebuild the HTTP client there
        return {"url": self.url, "language": self.language}

    def __setstate__(self, state):
        self.__init__(state["url"], state["language"])


def find_server_jar(folder: str | Path) -> Path:
    """languagetool-server.jar inside an unpacked LanguageTool folder (or one level down)."""
    folder = Path(folder)
    for pattern in ("languagetool-server.jar", "*/languagetool-server.jar"):
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError(f"{folder}: no languagetool-server.jar (unpack a LanguageTool release there)")


class LocalLanguageTool:
    """A LanguageTool server started from a local folder on 127.0.0.1, stopped by `close()`."""

    def __init__(self, folder: str | Path, language: str = "en-US", start_timeout: float = 120.0):
        jar = find_server_jar(folder)
        java = shutil.which("java")
        if java is None:
            raise ValueError("LanguageTool needs Java: no `java` on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [java, "-cp", str(jar), "org.languagetool.server.HTTPServer", "--port", str(port)],
            cwd=jar.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = LanguageToolClient(f"http://127.0.0.1:{port}", language)
        deadline = time.time() + start_timeout
        while True:
            try:
                self.client.ping()
                break
            except ValueError:
                if self.process.poll() is not None or time.time() > deadline:
                    self.close()
                    raise ValueError(f"LanguageTool from {jar} did not start (exit code "
                                     f"{self.process.returncode}) within {start_timeout:.0f}s") from None
                time.sleep(1.0)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


GRAMMAR_UNAVAILABLE = ("LanguageTool is not installed: no package registry ships it offline; "
                       f"pass --languagetool URL (a running server) or FOLDER (an unpacked release; "
                       f"needs Java), or set ${LANGUAGETOOL_ENV}")


def open_grammar_checker(spec: str | None, language: str = "en-US"):
    """(checker or None, note, closer) for a LanguageTool URL, a folder, or nothing.

    Nothing given (and no environment variable): no checker and the reason. Something
    given that does not work is an error, not a silent fallback.
    """
    spec = spec or os.environ.get(LANGUAGETOOL_ENV) or None
    if not spec:
        return None, GRAMMAR_UNAVAILABLE, (lambda: None)
    if spec.startswith(("http://", "https://")):
        client = LanguageToolClient(spec, language)
        client.ping()
        return client, f"LanguageTool server at {spec}", (lambda: None)
    if not Path(spec).is_dir():
        raise FileNotFoundError(f"languagetool: {spec} is neither an http(s) URL nor a folder")
    server = LocalLanguageTool(spec, language)
    return server.client, f"LanguageTool started from {spec}", server.close


# ================================================================== factors


class FactorStage(Stage):
    """Explanation rows in, factor columns out (keyed by `row`).

    Holds the item reviews, the WI table and the encoder reference; `setup()` loads the
    sentence encoder once per actor. The grammar checker (a LanguageTool client) travels
    with the stage and reconnects in each actor: a server started from a local folder
    listens on 127.0.0.1, so on a multi-node cluster pass a URL the workers can reach.
    `encoder` and `grammar` may be given as objects (tests, in-process runs).
    """

    name = "expscore-factors"

    def __init__(self, factors: Sequence[str], term_frequency: dict[str, int],
                 reviews: dict[str, list[str]], *, encoder_ref: str | None = None, device: str = "auto",
                 encoder=None, grammar=None, repetition_n: int = 2, batch_size: int = 512,
                 resources: Resources = ONE_CPU):
        self.factors = list(factors)
        self.term_frequency = term_frequency
        self.reviews = reviews
        self.encoder_ref = encoder_ref
        self.device = device
        self.encoder = encoder
        self.grammar = grammar
        self.repetition_n = repetition_n
        self.batch_size = batch_size
        self.resources = resources
        self._centroids: dict = {}

    def setup(self) -> None:
        if self.encoder is None and "REL" in self.factors:
            from models.encoders.embedder import build_embedder

            self.encoder = build_embedder(self.encoder_ref, device=self.device)

    def process(self, batch: pa.Table) -> pa.Table:
        if self.encoder is None and "REL" in self.factors:
            self.setup()
        frame = batch.to_pandas()
        if "item_reviews" not in frame.columns:
            frame["item_reviews"] = [self.reviews.get(i, []) for i in frame["item_id"]]
        table = factor_table(frame, encoder=self.encoder, term_frequency=self.term_frequency,
                             grammar=self.grammar, features_column="features",
                             repetition_n=self.repetition_n, factors=self.factors,
                             centroid_cache=self._centroids)
        cols = {"row": batch.column("row")}
        cols.update({f: pa.array(table.values[f].to_numpy(), pa.float64()) for f in self.factors})
        return pa.table(cols)


def rows_table(rows: list[dict]) -> pa.Table:
    """The columns the factor stage reads, sorted by item so batches share reviews."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["item_id"], i))
    data = {"row": order, "explanation": [rows[i]["explanation"] for i in order],
            "item_id": [rows[i]["item_id"] for i in order],
            "features": pa.array([rows[i]["features"] for i in order], pa.list_(pa.string()))}
    if rows and "item_reviews" in rows[0]:
        data["item_reviews"] = pa.array([rows[i]["item_reviews"] for i in order], pa.list_(pa.string()))
    return pa.table(data)


def compute_factors(rows: list[dict], stage: FactorStage, mode: str, min_rows: int,
                    progress: Callable[[str], None] = print) -> pd.DataFrame:
    """Factor values per row (index = position in `rows`), in process or on Ray Data."""
    table = rows_table(rows)
    use_ray = mode == "always" or (mode == "auto" and len(rows) >= min_rows)
    if not rows:
        return pd.DataFrame(columns=stage.factors, dtype=np.float64)
    if use_ray:
        import ray

        from pipelines.ray_runtime import init_ray, map_stage

        init_ray()
        progress(f"factors: {len(rows):,} rows on Ray Data (batches of {stage.batch_size})")
        # One block per batch (rows are sorted by item, so a block holds few items).
        blocks = [table.slice(s, stage.batch_size) for s in range(0, len(rows), stage.batch_size)]
        ds = map_stage(ray.data.from_arrow(blocks), stage)
        out = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    else:
        progress(f"factors: {len(rows):,} rows in process")
        stage.setup()
        parts = [stage.process(table.slice(s, stage.batch_size)) for s in range(0, len(rows), stage.batch_size)]
        out = pa.concat_tables(parts)
    return out.to_pandas().set_index("row").sort_index()


def undefined_factor_errors(rows: list[dict], values: pd.DataFrame, factors: Sequence[str]) -> tuple[list[int], list[dict]]:
    """Positions of rows whose used factors are all finite, and error rows for the others."""
    keep, errors = [], []
    for i, row in enumerate(rows):
        bad = [f for f in factors if not np.isfinite(values.at[i, f])]
        if bad:
            errors.append(_error(row["source"], row["line"], row["example_id"], bad[0], "undefined_factor",
                                 f"factor {bad[0]} ({FACTOR_NAMES[bad[0]]}) is undefined for this explanation"))
        else:
            keep.append(i)
    return keep, errors


# ================================================================== report math


def correlations(x: Sequence[float], y: Sequence[float]) -> dict[str, float | None]:
    """Pearson's r and Kendall's tau (tau-b) with p-values; None where undefined
    (fewer than 3 rows, or a constant side)."""
    from scipy import stats

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    out: dict[str, float | None] = {"n": len(x), "pearson": None, "pearson_p": None,
                                    "kendall": None, "kendall_p": None}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    r = stats.pearsonr(x, y)
    t = stats.kendalltau(x, y)
    out.update(pearson=float(r.statistic), pearson_p=float(r.pvalue),
               kendall=float(t.statistic), kendall_p=float(t.pvalue))
    return out


def accuracy_within(pred: Sequence[float], label: Sequence[float], tol: float = 0.5) -> float | None:
    """Share of predictions within label ± tol (seed 003, Table 4)."""
    pred = np.asarray(pred, dtype=np.float64)
    label = np.asarray(label, dtype=np.float64)
    return float(np.mean(np.abs(pred - label) <= tol)) if len(pred) else None


def head_metrics(model: ExpScoreModel, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    if len(y) == 0:
        return {"n": 0}
    pred = model.predict(x)
    return {**correlations(pred, y), "accuracy": accuracy_within(pred, y), "loss": model.loss(x, y),
            "loss_type": "CE" if model.head == "logistic" else "MSE"}


def split_rows(n: int, test_fraction: float, seed: int) -> np.ndarray:
    """"train" / "test" per row from a seeded permutation (test = round(fraction * n))."""
    order = np.random.default_rng(seed).permutation(n)
    labels = np.array(["train"] * n, dtype=object)
    labels[order[: round(test_fraction * n)]] = "test"
    return labels


# ================================================================== report text


def _fmt(v: Any, digits: int = 3) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def report_markdown(report: dict) -> str:
    """report.json as Markdown: the seed's Tables 1-4 on this data."""
    lines = [f"# ExpScore {report['job']}", "", "| rows | count |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in report["counts"].items()] + [""]
    heads = report.get("heads") or {}
    for part in ("test", "train", "score"):
        have = {h: m[part] for h, m in heads.items() if m.get(part, {}).get("n")}
        if not have:
            continue
        lines += [f"## Heads against human ratings ({part} rows)", "",
                  "| head | n | Pearson r | Kendall τ | accuracy (±0.5) | loss type | loss |",
                  "|---|---:|---:|---:|---:|---|---:|"]
        for h, m in have.items():
            lines.append(f"| ExpScore ({h}) | {m['n']} | {_fmt(m.get('pearson'))} | {_fmt(m.get('kendall'))} | "
                         f"{_fmt(m.get('accuracy'))} | {m.get('loss_type', '')} | {_fmt(m.get('loss'), 4)} |")
        lines.append("")
    factors = report.get("factor_correlations") or {}
    if factors:
        lines += ["## Single factors against human ratings (all scored rows)", "",
                  "| factor | | Pearson r | Kendall τ |", "|---|---|---:|---:|"]
        for f, m in factors.items():
            if m is None:
                lines.append(f"| {f} | {FACTOR_NAMES[f]} | unavailable | unavailable |")
            else:
                lines.append(f"| {f} | {FACTOR_NAMES[f]} | {_fmt(m.get('pearson'))} | {_fmt(m.get('kendall'))} |")
        lines.append("")
    weights = report.get("linear_weights")
    if weights:
        names = [f for f in FACTORS if f in weights]
        lines += ["## Factor weights of ExpScore (linear), on z-scored factors", "",
                  "| " + " | ".join(names) + " | bias |", "|" + "---:|" * (len(names) + 1),
                  "| " + " | ".join(_fmt(weights[f]) for f in names) + f" | {_fmt(weights['bias'])} |", ""]
    for note in report.get("notes") or []:
        lines.append(f"- {note}")
    return "\n".join(lines).rstrip() + "\n"


# ================================================================== outputs


def scores_table(rows: list[dict], split: Sequence[str], values: pd.DataFrame,
                 predictions: dict[str, np.ndarray]) -> pa.Table:
    n = len(rows)
    data: dict[str, Any] = {
        "example_id": [r["example_id"] for r in rows], "source": [r["source"] for r in rows],
        "line": [r["line"] for r in rows], "split": list(split), "item_id": [r["item_id"] for r in rows],
        "rating": [r["rating"] for r in rows]}
    for f in FACTORS:
        data[f] = values[f].to_numpy(dtype=np.float64) if f in values.columns else [None] * n
    for h in HEADS:
        data[f"expscore_{h}"] = predictions.get(h, [None] * n)
    return pa.Table.from_pydict(data, schema=SCORES_SCHEMA)


def _write_outputs(out: Path, scores: pa.Table, errors: list[dict], report: dict) -> None:
    write_parquet_atomic(out / "scores.parquet", scores)
    write_parquet_atomic(out / "errors.parquet", error_rows(STAGE, errors))
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text(report_markdown(report))


def _encoder_ref(cfg: _Inputs) -> str:
    if cfg.embedder:
        return cfg.embedder
    from models.profiles import load_profile

    return load_profile(cfg.profile).require(ENCODER_ROLE)


def _factor_rows(rows: list[dict], values: pd.DataFrame, keep: list[int]) -> tuple[list[dict], pd.DataFrame]:
    return [rows[i] for i in keep], values.loc[keep].reset_index(drop=True)


# ================================================================== train


def run_train(cfg: ExpScoreTrainConfig, *, overwrite: bool = False, encoder=None, grammar=None,
              progress: Callable[[str], None] = print) -> dict:
    """Read, compute factors, split, train the heads, write model + scores + report.

    `encoder` / `grammar` replace the profile's sentence encoder / the LanguageTool
    checker (tests pass fakes); otherwise they come from the config.
    """
    out = Path(cfg.out)
    settings = cfg.train_settings()
    rows, errors, has_features = load_examples(cfg, "required", (cfg.rating_min, cfg.rating_max))
    n_in = len(rows) + len(errors)
    rows, more, corpus, by_item = attach_reviews(rows, cfg)
    errors += more
    progress(f"inputs: {n_in:,} rows, {len(rows):,} usable, {len(errors):,} errors")
    if len(rows) < 3:
        first = "; ".join(f"{e['source']} row {e['line']}: {e['message']}" for e in errors[:3])
        raise ValueError(f"only {len(rows)} usable rows; ExpScore needs at least 3 rated explanations"
                         + (f" (first problems: {first})" if first else ""))
    job = ShardedOutput(out, "expscore-train", cfg.model_dump(), tables=[]).open(overwrite=overwrite)
    unavailable: dict[str, str] = {}
    close = lambda: None
    if grammar is None:
        grammar, note, close = open_grammar_checker(cfg.languagetool, cfg.language)
        if grammar is None:
            unavailable["GC"] = note
    if not has_features:
        unavailable["FA"] = f"no {cfg.features_column!r} column in the inputs"
    used = [f for f in FACTORS if f not in unavailable]
    tf = dict(term_frequencies(corpus))
    encoder_ref = None if encoder is not None else _encoder_ref(cfg)
    stage = FactorStage(used, tf, by_item, encoder_ref=encoder_ref, device=cfg.device, encoder=encoder,
                        grammar=grammar, repetition_n=cfg.repetition_n, batch_size=cfg.batch_size)
    try:
        values = compute_factors(rows, stage, cfg.ray, cfg.ray_min_rows, progress)
    finally:
        close()
    keep, more = undefined_factor_errors(rows, values, used)
    errors += more
    rows, values = _factor_rows(rows, values, keep)
    split = split_rows(len(rows), cfg.test_fraction, cfg.seed)
    if (split == "train").sum() < 2:
        raise ValueError("fewer than 2 training rows after the split; lower test_fraction or add data")
    y = np.array([r["rating"] for r in rows], dtype=np.float64)
    x = values[used].to_numpy(dtype=np.float64)
    train, test = split == "train", split == "test"

    factor_settings = {"term_frequency": tf, "repetition_n": cfg.repetition_n, "encoder": encoder_ref,
                       "encoder_role": ENCODER_ROLE, "language": cfg.language,
                       "max_reviews_per_item": cfg.max_reviews_per_item,
                       "stop_words": "scikit-learn ENGLISH_STOP_WORDS", "factors": used,
                       "unavailable": unavailable}
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(model_dir / FACTORS_JSON, factor_settings)
    heads: dict[str, dict] = {}
    predictions: dict[str, np.ndarray] = {}
    linear_weights = None
    for head in heads_of(cfg.head):
        progress(f"training the {head} head on {int(train.sum()):,} rows")
        model = train_head(x[train], y[train], head, used, settings, unavailable,
                           extra={"encoder": encoder_ref})
        model.save(model_dir / head)
        predictions[head] = model.predict(x)
        heads[head] = {"train": head_metrics(model, x[train], y[train]),
                       "test": head_metrics(model, x[test], y[test]), "history": model.history}
        if head == "nn":
            heads[head]["hidden"] = list(model.n_hidden())
        if head == "linear":
            linear_weights = model.weights()

    report = {
        "job": "train",
        "counts": {"rows_in": n_in, "scored": len(rows), "errors": len(errors),
                   "train": int(train.sum()), "test": int(test.sum())},
        "factors": used, "unavailable": unavailable, "heads": heads,
        "factor_correlations": {f: (None if f in unavailable else correlations(values[f], y)) for f in FACTORS},
        "linear_weights": linear_weights,
        "settings": {**settings.model_dump(), "test_fraction": cfg.test_fraction, "encoder": encoder_ref},
        "notes": _notes(unavailable),
    }
    _write_outputs(out, scores_table(rows, split, values, predictions), errors, report)
    job.finish(shards=0, counts=report["counts"])
    return report


def _notes(unavailable: dict[str, str]) -> list[str]:
    """One line per factor the model was trained and scores without, with the reason."""
    return [f"{f} ({FACTOR_NAMES[f]}) unavailable, so trained and scored without it: {why}"
            for f, why in unavailable.items()]


# ================================================================== score


def load_models(path: str | Path, head: str) -> tuple[dict[str, ExpScoreModel], dict]:
    """The heads asked for from a model folder (or one head's folder), and its factor settings."""
    p = Path(path)
    if (p / "expscore.json").exists() and (p.parent / FACTORS_JSON).exists():
        root, found = p.parent, {p.name: p}
    elif (p / FACTORS_JSON).exists():
        root, found = p, {h: p / h for h in HEADS if (p / h / "expscore.json").exists()}
    else:
        raise FileNotFoundError(f"{p} is not an ExpScore model folder (no {FACTORS_JSON}); "
                                "give the `model` folder that `rexeval expscore train` wrote")
    wanted = heads_of(head) if head != "all" else list(found)
    missing = [h for h in wanted if h not in found]
    if missing:
        raise FileNotFoundError(f"{p} has no {missing[0]!r} head (it has: {', '.join(found) or 'none'})")
    settings = json.loads((root / FACTORS_JSON).read_text())
    return {h: ExpScoreModel.load(found[h]) for h in wanted}, settings


def run_score(cfg: ExpScoreScoreConfig, *, overwrite: bool = False, encoder=None, grammar=None,
              progress: Callable[[str], None] = print) -> dict:
    """Score explanations with a trained model; ratings, when the input has them, are
    compared with the scores in the report."""
    out = Path(cfg.out)
    models, settings = load_models(cfg.model, cfg.head)
    needed = [f for f in FACTORS if any(f in m.factors for m in models.values())]
    if "GC" in needed and grammar is None and not (cfg.languagetool or os.environ.get(LANGUAGETOOL_ENV)):
        raise ValueError(f"the model uses grammar correctness (GC): {GRAMMAR_UNAVAILABLE}")
    first = next(iter(models.values())).settings
    rows, errors, has_features = load_examples(cfg, "optional", (first.rating_min, first.rating_max))
    n_in = len(rows) + len(errors)
    rows, more, _, by_item = attach_reviews(rows, cfg)
    errors += more
    progress(f"inputs: {n_in:,} rows, {len(rows):,} usable, {len(errors):,} errors")
    if "FA" in needed and not has_features:
        raise ValueError(f"the model uses feature appearance (FA) but the inputs have no "
                         f"{cfg.features_column!r} column")
    job = ShardedOutput(out, "expscore-score", cfg.model_dump(), tables=[]).open(overwrite=overwrite)
    close = lambda: None
    if "GC" in needed and grammar is None:
        grammar, _, close = open_grammar_checker(cfg.languagetool, cfg.language)
    encoder_ref = settings.get("encoder")
    notes = []
    if cfg.embedder and cfg.embedder != encoder_ref:
        notes.append(f"relevance uses {cfg.embedder}, not the encoder the model was trained with ({encoder_ref})")
        encoder_ref = cfg.embedder
    if encoder is None and "REL" in needed and not encoder_ref:
        encoder_ref = _encoder_ref(cfg)
    stage = FactorStage(needed, settings["term_frequency"], by_item, encoder_ref=encoder_ref, device=cfg.device,
                        encoder=encoder, grammar=grammar if "GC" in needed else None,
                        repetition_n=int(settings.get("repetition_n", 2)), batch_size=cfg.batch_size)
    try:
        values = compute_factors(rows, stage, cfg.ray, cfg.ray_min_rows, progress)
    finally:
        close()
    keep, more = undefined_factor_errors(rows, values, needed)
    errors += more
    rows, values = _factor_rows(rows, values, keep)
    predictions = {h: m.predict(values[list(m.factors)].to_numpy(dtype=np.float64)) for h, m in models.items()}
    rated = np.array([r["rating"] is not None for r in rows], dtype=bool)
    y = np.array([r["rating"] if r["rating"] is not None else np.nan for r in rows], dtype=np.float64)
    heads = {}
    for h, m in models.items():
        x = values[list(m.factors)].to_numpy(dtype=np.float64)
        heads[h] = {"score": head_metrics(m, x[rated], y[rated]) if rated.any() else {"n": 0}}
    unavailable = dict(settings.get("unavailable") or {})
    report = {
        "job": "score",
        "counts": {"rows_in": n_in, "scored": len(rows), "errors": len(errors), "rated": int(rated.sum())},
        "model": str(cfg.model), "factors": needed, "unavailable": unavailable, "heads": heads,
        "factor_correlations": ({f: (None if f not in needed else correlations(values[f][rated], y[rated]))
                                 for f in FACTORS} if rated.sum() >= 3 else {}),
        "linear_weights": models["linear"].weights() if "linear" in models else None,
        "notes": _notes(unavailable) + notes,
    }
    _write_outputs(out, scores_table(rows, ["score"] * len(rows), values, predictions), errors, report)
    job.finish(shards=0, counts=report["counts"])
    return report
