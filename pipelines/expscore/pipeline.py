"""ExpScore end to end (seed 003): rated explanations -> factors -> trained heads -> report;
and a trained model -> scores of new explanations.

Inputs are read and checked by `pipelines.expscore.inputs` (every unusable row becomes
a row of `errors.parquet`, ERRORS; every other row is in `scores.parquet`). The
word-importance corpus (WI) is every review text given; it is saved with the model and
reused when scoring, so a factor means the same thing at training and scoring time.

Grammar (GC) needs LanguageTool (`models.languagetool`); without one GC is
*unavailable*: the heads are trained and scored without it and the report
(`pipelines.expscore.report`) says so.

Factors are computed by one Stage (`FactorStage`). A small job runs in process; with
`ray: always`, or `auto` once the explanations or the reviews reach `ray_min_rows` rows,
it runs on Ray workers (`pipelines.expscore.on_ray`): the inputs read, the reviews joined
and counted, the factors computed and the heads trained by Ray tasks and actors, so the
driver never holds a table. Either way the split, the heads and the outputs are
`finish_train` / `finish_score` on the same rows and factors. The math
lives in `metrics.expscore_factors` and `models.expscore`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rexeval.metrics.expscore_factors import (
    FACTOR_NAMES,
    FACTORS,
    factor_table,
    term_frequencies,
)
from rexeval.models.expscore import HEADS, ExpScoreModel, train_head
from rexeval.models.languagetool import (
    GRAMMAR_UNAVAILABLE,
    LANGUAGETOOL_ENV,
    open_grammar_checker,
)
from rexeval.pipelines.expscore.baselines import available_baselines, baseline_values
from rexeval.pipelines.expscore.config import (ENCODER_ROLE, EXPSCORE_SCORE_OUTPUTS, EXPSCORE_TRAIN_OUTPUTS, ExpScoreInputs,
                                             ExpScoreScoreConfig, ExpScoreTrainConfig)
from rexeval.pipelines.expscore.inputs import (
    Loaded,
    attach_reviews,
    error_row,
    load_examples,
    split_rows,
)
from rexeval.pipelines.expscore.report import (
    baseline_correlations,
    baseline_notes,
    correlations,
    head_metrics,
    report_markdown,
    unavailable_notes,
)
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import (
    ShardedOutput,
    write_json_atomic,
    write_parquet_atomic,
)
from rexeval.storage import Location, local_copy, location
from rexeval.pipelines.core.schema import error_rows
from rexeval.pipelines.core.stage import Resources, Stage

STAGE = "expscore"
FACTORS_JSON = "factors.json"
ONE_CPU = Resources(cpus=1)

SCORES_SCHEMA = pa.schema(
    [pa.field("example_id", pa.string(), nullable=False), pa.field("source", pa.string()),
     pa.field("line", pa.int64()), pa.field("split", pa.string(), nullable=False),
     pa.field("item_id", pa.string(), nullable=False), pa.field("rating", pa.float64())]
    + [pa.field(f, pa.float64()) for f in FACTORS]
    + [pa.field(f"expscore_{h}", pa.float64()) for h in HEADS])


# ================================================================== settings


def _nothing_to_close() -> None:
    """The closer when the caller owns the grammar checker (or there is none)."""


def heads_of(head: str) -> list[str]:
    return list(HEADS) if head == "all" else [head]


# ================================================================== factors


class FactorStage(Stage):
    """Explanation rows in, factor columns out (keyed by `row`).

    Holds the item reviews, the WI table and the encoder reference; `setup()` loads the
    sentence encoder once per actor. The grammar checker (a LanguageTool client) travels
    with the stage and reconnects in each actor: a server started from a local folder
    listens on 127.0.0.1, so on a multi-node cluster pass a URL the workers can reach.
    `encoder` and `grammar` may be given as objects (tests, in-process runs). `carry`:
    columns of the rows copied to the output (on Ray, what the heads' task needs of them).
    `baselines`: text-overlap baselines against the item's reviews computed beside the
    factors (`expscore.baselines`, seed 003's Table 1; training only).
    """

    name = "expscore-factors"

    def __init__(self, factors: Sequence[str], term_frequency: dict[str, int],
                 reviews: dict[str, list[str]], *, encoder_ref: str | None = None, device: str = "auto",
                 encoder=None, grammar=None, repetition_n: int = 2, batch_size: int = 512,
                 resources: Resources = ONE_CPU, carry: Sequence[str] = (), baselines: Sequence[str] = ()):
        self.factors = list(factors)
        self.baselines = list(baselines)
        self.term_frequency = term_frequency
        self.reviews = reviews
        self.encoder_ref = encoder_ref
        self.device = device
        self.encoder = encoder
        self.grammar = grammar
        self.repetition_n = repetition_n
        self.batch_size = batch_size
        self.resources = resources
        self.carry = list(carry)  # the rows' own columns copied beside their factors
        self._centroids: dict = {}

    def setup(self) -> None:
        if self.encoder is None and "REL" in self.factors:
            from rexeval.models.encoders.embedder import build_embedder

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
        cols = {"row": batch.column("row"), **{c: batch.column(c) for c in self.carry}}
        cols.update({f: pa.array(table.values[f].to_numpy(), pa.float64()) for f in self.factors})
        if self.baselines:
            values = baseline_values(frame["explanation"].tolist(), frame["item_reviews"].tolist(), self.baselines)
            cols.update({b: pa.array(values[b], pa.float64()) for b in self.baselines})
        return pa.table(cols)

    @property
    def columns(self) -> list[str]:
        """The value columns `process` writes: the factors, then the baselines."""
        return self.factors + self.baselines


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

        from rexeval.pipelines.core.runtime import init_ray, map_stage, worker_failures

        init_ray()
        progress(f"factors: {len(rows):,} rows on Ray Data (batches of {stage.batch_size})")
        # One block per batch (rows are sorted by item, so a block holds few items).
        blocks = [table.slice(s, stage.batch_size) for s in range(0, len(rows), stage.batch_size)]
        ds = map_stage(ray.data.from_arrow(blocks), stage)
        with worker_failures(stage):
            out = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    else:
        progress(f"factors: {len(rows):,} rows in process")
        stage.setup()
        parts = [stage.process(table.slice(s, stage.batch_size)) for s in range(0, len(rows), stage.batch_size)]
        out = pa.concat_tables(parts)
    return out.to_pandas().set_index("row").sort_index()


def undefined_factor_errors(rows: list[dict], values: pd.DataFrame,
                            factors: Sequence[str]) -> tuple[list[int], list[dict]]:
    """Positions of rows whose used factors are all finite, and error rows for the others."""
    keep, errors = [], []
    for i, row in enumerate(rows):
        bad = [f for f in factors if not np.isfinite(values.at[i, f])]
        if bad:
            errors.append(error_row(row["source"], row["line"], row["example_id"], bad[0], "undefined_factor",
                                    f"factor {bad[0]} ({FACTOR_NAMES[bad[0]]}) is undefined for this explanation"))
        else:
            keep.append(i)
    return keep, errors


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


def _write_outputs(out: Location, scores: pa.Table, errors: list[dict], report: dict) -> None:
    write_parquet_atomic(out / EXPSCORE_SCORE_OUTPUTS.scores, scores)
    write_parquet_atomic(out / EXPSCORE_SCORE_OUTPUTS.errors, error_rows(STAGE, errors))
    write_json_atomic(out / EXPSCORE_SCORE_OUTPUTS.report, report)
    (out / EXPSCORE_SCORE_OUTPUTS.report_md).write_text(report_markdown(report))


def _encoder_ref(cfg: ExpScoreInputs) -> str:
    if cfg.embedder:
        return cfg.embedder
    from rexeval.models.profiles import load_profile

    return load_profile(cfg.profile, cfg.models).require(ENCODER_ROLE)


def _factor_rows(rows: list[dict], values: pd.DataFrame, keep: list[int]) -> tuple[list[dict], pd.DataFrame]:
    return [rows[i] for i in keep], values.loc[keep].reset_index(drop=True)


# ================================================================== train


def run_train(cfg: ExpScoreTrainConfig, *, overwrite: bool = False, encoder=None, grammar=None,
              progress: Callable[[str], None] = print) -> dict:
    """Read, compute factors, split, train the heads, write model + scores + report.

    In process, or on Ray workers (`use_ray`: `pipelines.expscore.on_ray`), where this
    driver holds counts and the report, never a table. `encoder` / `grammar` replace the
    profile's sentence encoder / the LanguageTool checker (tests pass fakes); otherwise
    they come from the config.
    """
    out = location(cfg.out)
    loaded = load_inputs(cfg, "required", (cfg.rating_min, cfg.rating_max), want_tf=True)
    errors = loaded.errors
    progress(f"inputs: {loaded.n_in:,} rows, {loaded.n_rows:,} usable, {len(errors):,} errors")
    if loaded.n_rows < 3:
        first = "; ".join(f"{e['source']} row {e['line']}: {e['message']}" for e in errors[:3])
        raise ValueError(f"only {loaded.n_rows} usable rows; ExpScore needs at least 3 rated explanations"
                         + (f" (first problems: {first})" if first else ""))
    job = ShardedOutput(out, "expscore-train", cfg.recorded(), tables=[], owns=EXPSCORE_TRAIN_OUTPUTS.paths()).open(overwrite=overwrite)
    unavailable: dict[str, str] = {}
    close: Callable[[], None] = _nothing_to_close
    if grammar is None:
        grammar, note, close = open_grammar_checker(cfg.languagetool, cfg.language)
        if grammar is None:
            unavailable["GC"] = note
    if not loaded.has_features:
        unavailable["FA"] = f"no {cfg.features_column!r} column in the inputs"
    used = [f for f in FACTORS if f not in unavailable]
    encoder_ref = None if encoder is not None else _encoder_ref(cfg)
    baselines, baselines_unavailable = available_baselines()
    stage = FactorStage(used, loaded.tf, loaded.by_item, encoder_ref=encoder_ref, device=cfg.device,
                        encoder=encoder, grammar=grammar, repetition_n=cfg.repetition_n, batch_size=cfg.batch_size,
                        baselines=baselines)
    finish = dict(cfg=cfg, errors=errors, n_in=loaded.n_in, used=used, unavailable=unavailable, tf=loaded.tf,
                  encoder_ref=encoder_ref, progress=progress, baselines=baselines,
                  baselines_unavailable=baselines_unavailable)
    try:
        report = _finish(loaded, stage, finish_train, finish, progress)
    finally:
        close()
    job.finish(shards=0, counts=report["counts"])
    return report


def finish_train(cfg: ExpScoreTrainConfig, rows: list[dict], values: pd.DataFrame, errors: list[dict], n_in: int,
                 used: list[str], unavailable: dict[str, str], tf: dict[str, int], encoder_ref: str | None,
                 progress: Callable[[str], None] = print, baselines: Sequence[str] = (),
                 baselines_unavailable: dict[str, str] | None = None) -> dict:
    """The rows' factors (`values`, by position) -> the split, the trained heads, the
    model folder, scores, errors and the report; returns the report. Where the factors
    are: this process, or a Ray task of the job (`on_ray`). `values` also holds the
    `baselines` columns, correlated with the ratings on the heads' rows (Table 1)."""
    out = location(cfg.out)
    settings = cfg.train_settings()
    keep, more = undefined_factor_errors(rows, values, used)
    errors = errors + more
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
    model_dir = out / EXPSCORE_TRAIN_OUTPUTS.model
    model_dir.mkdir()
    write_json_atomic(model_dir / FACTORS_JSON, factor_settings)
    heads: dict[str, dict] = {}
    predictions: dict[str, np.ndarray] = {}
    linear_weights = None
    for head in heads_of(cfg.head):
        progress(f"training the {head} head on {int(train.sum()):,} rows")
        model = train_head(x[train], y[train], head, used, settings, unavailable,
                           extra={"encoder": encoder_ref})
        _save_head(model, model_dir / head)
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
        "baselines": baseline_correlations(values, y, {"train": train, "test": test}, baselines,
                                           baselines_unavailable or {}),
        "linear_weights": linear_weights,
        "settings": {**settings.model_dump(), "test_fraction": cfg.test_fraction, "encoder": encoder_ref},
        "notes": unavailable_notes(unavailable) + baseline_notes(baselines_unavailable or {}),
    }
    _write_outputs(out, scores_table(rows, split, values, predictions), errors, report)
    return report


# ================================================================== inputs, here or on Ray


def _finish(loaded: Loaded, stage: FactorStage, finish: Callable, kwargs: dict,
            progress: Callable[[str], None]) -> dict:
    """The factors of the rows, then `finish(rows=, values=, **kwargs)`: here, or on Ray
    (the factors on an actor pool, `finish` in a Ray task: `on_ray.finish_on_ray`)."""
    if loaded.dataset is not None:
        from rexeval.pipelines.expscore.on_ray import finish_on_ray

        return finish_on_ray(loaded.dataset, stage, finish, kwargs, progress)
    values = compute_factors(loaded.rows, stage, "never", 1, progress)
    return finish(rows=loaded.rows, values=values, **kwargs)


def use_ray(cfg: ExpScoreInputs) -> bool:
    """`ray`: always, never, or (auto) when the explanations or the reviews reach
    `ray_min_rows` rows, counted without reading a table (`on_ray.input_rows`)."""
    if cfg.ray != "auto":
        return cfg.ray == "always"
    from rexeval.pipelines.expscore.on_ray import input_rows

    return input_rows(cfg) >= cfg.ray_min_rows


def load_inputs(cfg: ExpScoreInputs, rating: str, scale: tuple[float, float], want_tf: bool) -> Loaded:
    """The inputs checked (`inputs.load_examples`) and given their item's reviews
    (`inputs.attach_reviews`), here or on Ray (`use_ray`)."""
    if use_ray(cfg):
        from rexeval.pipelines.expscore.on_ray import load_on_ray

        return load_on_ray(cfg, rating, scale, want_tf)
    rows, errors, has_features = load_examples(cfg, rating, scale)
    n_in = len(rows) + len(errors)
    rows, more, corpus, by_item = attach_reviews(rows, cfg)
    return Loaded(errors + more, n_in, len(rows), has_features, dict(term_frequencies(corpus)) if want_tf else None,
                  rows, by_item)


# ================================================================== score


def _save_head(model: ExpScoreModel, folder: Location) -> None:
    """Save a trained head where the model folder is: in place on the local disk, else
    written to a temporary folder and uploaded (the model saves only to a local folder)."""
    if folder.is_local:
        model.save(folder.local_path())
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rexeval-expscore-") as tmp:
        folder.upload(model.save(Path(tmp) / folder.name))


def _load_head(folder: Location) -> ExpScoreModel:
    """A head from a model folder, local or by URI (copied here first: torch reads a local file)."""
    with local_copy(folder) as local:
        return ExpScoreModel.load(local)


def load_models(path: str | Path, head: str) -> tuple[dict[str, ExpScoreModel], dict]:
    """The heads asked for from a model folder (or one head's folder), local or by URI,
    and its factor settings."""
    p, shown = location(path), given_text(path)
    if (p / "expscore.json").exists() and (p.parent / FACTORS_JSON).exists():
        root, found = p.parent, {p.name: p}
    elif (p / FACTORS_JSON).exists():
        root, found = p, {h: p / h for h in HEADS if (p / h / "expscore.json").exists()}
    else:
        raise FileNotFoundError(f"{shown} is not an ExpScore model folder (no {FACTORS_JSON}); "
                                "give the `model` folder that `rexeval expscore train` wrote")
    wanted = heads_of(head) if head != "all" else list(found)
    missing = [h for h in wanted if h not in found]
    if missing:
        raise FileNotFoundError(f"{shown} has no {missing[0]!r} head (it has: {', '.join(found) or 'none'})")
    settings = (root / FACTORS_JSON).read_json()
    return {h: _load_head(found[h]) for h in wanted}, settings


def run_score(cfg: ExpScoreScoreConfig, *, overwrite: bool = False, encoder=None, grammar=None,
              progress: Callable[[str], None] = print) -> dict:
    """Score explanations with a trained model; ratings, when the input has them, are
    compared with the scores in the report. In process or on Ray workers, as `run_train`."""
    out = location(cfg.out)
    models, settings = load_models(cfg.model, cfg.head)
    needed = [f for f in FACTORS if any(f in m.factors for m in models.values())]
    if "GC" in needed and grammar is None and not (cfg.languagetool or os.environ.get(LANGUAGETOOL_ENV)):
        raise ValueError(f"the model uses grammar correctness (GC): {GRAMMAR_UNAVAILABLE}")
    first = next(iter(models.values())).settings
    loaded = load_inputs(cfg, "optional", (first.rating_min, first.rating_max), want_tf=False)
    progress(f"inputs: {loaded.n_in:,} rows, {loaded.n_rows:,} usable, {len(loaded.errors):,} errors")
    if "FA" in needed and not loaded.has_features:
        raise ValueError(f"the model uses feature appearance (FA) but the inputs have no "
                         f"{cfg.features_column!r} column")
    job = ShardedOutput(out, "expscore-score", cfg.recorded(), tables=[], owns=EXPSCORE_SCORE_OUTPUTS.paths()).open(overwrite=overwrite)
    close: Callable[[], None] = _nothing_to_close
    if "GC" in needed and grammar is None:
        grammar, _, close = open_grammar_checker(cfg.languagetool, cfg.language)
    encoder_ref = settings.get("encoder")
    notes = []
    if cfg.embedder and cfg.embedder != encoder_ref:
        notes.append(f"relevance uses {cfg.embedder}, not the encoder the model was trained with ({encoder_ref})")
        encoder_ref = cfg.embedder
    if encoder is None and "REL" in needed and not encoder_ref:
        encoder_ref = _encoder_ref(cfg)
    stage = FactorStage(needed, settings["term_frequency"], loaded.by_item, encoder_ref=encoder_ref, device=cfg.device,
                        encoder=encoder, grammar=grammar if "GC" in needed else None,
                        repetition_n=int(settings.get("repetition_n", 2)), batch_size=cfg.batch_size)
    finish = dict(cfg=cfg, errors=loaded.errors, n_in=loaded.n_in, models=models, needed=needed, settings=settings,
                  notes=notes)
    try:
        report = _finish(loaded, stage, finish_score, finish, progress)
    finally:
        close()
    job.finish(shards=0, counts=report["counts"])
    return report


def finish_score(cfg: ExpScoreScoreConfig, rows: list[dict], values: pd.DataFrame, errors: list[dict], n_in: int,
                 models: dict[str, ExpScoreModel], needed: list[str], settings: dict, notes: list[str]) -> dict:
    """The rows' factors -> the heads' scores, the outputs and the report (returned); in
    this process or a Ray task of the job, as `finish_train`."""
    out = location(cfg.out)
    keep, more = undefined_factor_errors(rows, values, needed)
    errors = errors + more
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
        "notes": unavailable_notes(unavailable) + notes,
    }
    _write_outputs(out, scores_table(rows, ["score"] * len(rows), values, predictions), errors, report)
    return report
