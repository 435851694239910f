"""`rexeval evaluate` end to end on Ray: the seed's central finding as a property of our
metric code (a sentiment-flipped copy of the ground truth loses its statement-level
entailment while BERTScore barely moves), through the NLI Serve deployment the job
starts and stops; outputs, skipped metrics, resume, St2Exp and --extract."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
from rexeval.pipelines.evaluate.pipeline import run_evaluate
from rexeval.pipelines.evaluate.config import EvaluateConfig
from rexeval.pipelines.core.inputs import statements_from_annotations

SCRIPTED_NLI = "tests.doubles.nli:ScriptedNLI"
LLM = "tests.doubles.llm:ScriptedLLM"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    st = statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet")
    return write_flip_benchmark(st, tmp_path_factory.mktemp("flip"))


def _cfg(bench, out, **kw):
    base = dict(explanations=[bench["explanations"]], references=bench["references"],
                statements=[bench["statements"]], out=str(out), limit=40, bootstrap=200,
                models={"nli": "scripted"}, nli_scorer=SCRIPTED_NLI, chunk_size=32)
    return EvaluateConfig(**{**base, **kw})


def _means(out) -> dict[tuple[str, str], float]:
    agg = pq.read_table(out / "aggregates.parquet").to_pylist()
    return {(r["system"], r["metric"]): r["mean"] for r in agg}


@pytest.mark.slow
def test_flipped_copy_loses_entailment_not_bertscore(ray_session, bench, tmp_path):
    from rexeval.serve.nli import APP_NAME, running_apps, serve_running

    out = tmp_path / "eval"
    cfg = _cfg(bench, out, metrics=["statement_nli", "summac_zs", "bertscore", "overlap", "corpus",
                                    "alignscore", "meteor"])
    rep = run_evaluate(cfg, progress=lambda s: None)
    m = _means(out)
    for metric in ("stent_p", "stent_r", "stent_f1", "stent_bin_f1", "summac_zs"):
        assert m[("ground_truth", metric)] > 0.8, metric
        assert m[("ground_truth", metric)] - m[("flipped", metric)] > 0.5, metric
    assert m[("flipped", "stcoh_p")] < 0.1 < m[("ground_truth", "stcoh_p")]
    # Similarity stays high on the unfaithful copy: the seed's "factuality gap".
    assert m[("flipped", "bertscore-f1")] > 0.85
    assert m[("ground_truth", "bertscore-f1")] - m[("flipped", "bertscore-f1")] < 0.15
    # Outputs: long-format scores (one row per example and metric), aggregates, tables.
    scores = pq.read_table(out / "scores.parquet")
    assert set(rep["families_run"]) == {"statement_nli", "summac_zs", "bertscore", "overlap"}
    n_metrics = 8 + 1 + 3 + 2 + 9 + 1
    assert scores.num_rows == 80 * n_metrics
    agg = pq.read_table(out / "aggregates.parquet").to_pandas()
    row = agg[(agg.system == "flipped") & (agg.metric == "stent_p")].iloc[0]
    assert row["n"] == 40 and row["kind"] == "per_example" and row["ci_low"] <= row["mean"] <= row["ci_high"]
    assert agg[(agg.metric == "bleu-4")]["kind"].eq("corpus").all()
    md = (out / "tables.md").read_text()
    assert "Table IV" in md and "| StEnt-P |" in md and "Table VI" in md and "Table III" not in md
    assert "StEnt-P" in (out / "tables.csv").read_text()
    assert (out / "figure2.png").is_file() and "StEnt-bin-F1" in (out / "figure2.svg").read_text()  # Figure 2
    # Skipped, with the reason; nothing stands in for the missing model.
    assert "alignscore" in rep["skipped"] and "no PyPI package" in rep["skipped"]["alignscore"]
    nli_counts = rep["family_counts"]["statement_nli"]
    assert 0 < nli_counts["nli_unique_pairs"] <= nli_counts["nli_pairs"]
    assert rep["nli_service"] == f"serve:{APP_NAME}" and APP_NAME not in running_apps()
    assert not serve_running()  # the job started Serve, so it shut it down again

    # Same command again: every family resumes as done, same scores.
    again = run_evaluate(cfg, progress=lambda s: None)
    assert again["family_counts"] == rep["family_counts"]
    assert pq.read_table(out / "scores.parquet").to_pandas().equals(scores.to_pandas())  # NaN == NaN
    # One lost chunk is recomputed alone, to the same values.
    fam = out / "families" / "statement_nli"
    (fam / "_done" / "part-00001.json").unlink()
    (fam / "scores" / "part-00001.parquet").unlink()
    run_evaluate(cfg, progress=lambda s: None)
    assert pq.read_table(out / "scores.parquet").to_pandas().equals(scores.to_pandas())


@pytest.mark.slow
def test_local_profile_without_nli_skips_and_says_why(ray_session, bench, tmp_path):
    out = tmp_path / "eval"
    cfg = _cfg(bench, out, models={}, metrics=["statement_nli", "summac_zs", "overlap"], limit=5,
               nli_scorer="rexeval.models.encoders.nli:NLIScorer")
    rep = run_evaluate(cfg, progress=lambda s: None)
    assert rep["families_run"] == ["overlap"]
    assert "no PyPI package ships an NLI model" in rep["skipped"]["statement_nli"]
    assert "--model nli=PATH" in rep["skipped"]["summac_zs"]
    assert not any(k[1].startswith("stent") for k in _means(out))


@pytest.mark.slow
def test_st2exp_with_scripted_verifier(ray_session, bench, tmp_path):
    out = tmp_path / "eval"
    # "1" for statements whose sentence appears in the document; otherwise "0";
    # one statement always gets an answer with no verdict (counted as unparseable).
    log = tmp_path / "calls.jsonl"
    cfg = _cfg(bench, out, metrics=["st2exp"], limit=6, backend=LLM, cache=str(tmp_path / "cache.sqlite"),
               backend_options={"default": "1", "log": str(log),
                                "rules": [["may dislike that", "0"], ["Answer with 1 or 0", "1"]]},
               max_retries=1)
    rep = run_evaluate(cfg, progress=lambda s: None)
    m = _means(out)
    assert set(rep["families_run"]) == {"st2exp"}
    for s in ("ground_truth", "flipped"):
        assert 0.0 <= m[(s, "st2exp_f1")] <= 1.0
    counts = rep["family_counts"]["st2exp"]
    assert counts["verifier_asked"] > 0 and counts["verifier_calls"] >= counts["verifier_asked"]
    calls = len(log.read_text().splitlines())
    # A re-run is free: shards are done and every call is cached.
    run_evaluate(cfg, progress=lambda s: None)
    assert len(log.read_text().splitlines()) == calls


@pytest.mark.slow
def test_extract_runs_the_extraction_stage_for_systems_without_statements(ray_session, bench, tmp_path):
    out = tmp_path / "eval"
    triplets = json.dumps([{"statement": "the strings are bright", "topic": "sound", "sentiment": "positive"}])
    with pytest.raises(ValueError, match="extract needs a domain"):
        run_evaluate(_cfg(bench, tmp_path / "x", statements=[], extract=True), progress=lambda s: None)
    cfg = _cfg(bench, out, statements=[], extract=True, domain="instruments", limit=3, metrics=["statement_nli"],
               systems=["flipped"], backend=LLM, backend_options={"default": triplets},
               cache=str(tmp_path / "cache.sqlite"), models={"nli": "scripted", "embedder": "none"})
    rep = run_evaluate(cfg, progress=lambda s: None)
    st = pq.read_table(out / "extract" / "statements.parquet").to_pylist()
    assert {r["system"] for r in st} == {"flipped"} and len({r["example_id"] for r in st}) == 3
    assert rep["families_run"] == ["statement_nli"]
    assert np.isfinite(_means(out)[("flipped", "stent_p")])


def test_a_metric_from_one_file_runs_when_asked_and_never_by_default(ray_session, bench, tmp_path):
    """metrics/repetition.py (the extension guide's example) reaches the scores and the
    tables through the registries alone; `all` (seed 000's metrics) leaves it out."""
    from rexeval.pipelines.evaluate.families import select_families

    assert "texts" not in select_families(["all"], [])
    assert select_families(["distinct-2"], []) == ["texts"]
    out = tmp_path / "eval"
    rep = run_evaluate(_cfg(bench, out, metrics=["distinct-2"], limit=8), progress=lambda s: None)
    assert rep["families_run"] == ["texts"]
    means = _means(out)
    assert {m for _, m in means} == {"distinct-2"}
    assert all(0.0 < v <= 1.0 for v in means.values())
    tables = (out / "tables.md").read_text()
    assert "### Repetition inside an explanation" in tables and "| Distinct-2 |" in tables


def test_a_reference_free_metric_scores_a_table_that_has_no_references(ray_session, tmp_path):
    """A CSV of a system's explanations without a reference column: Distinct-2 (whose
    declared inputs are the explanation alone) scores every row, by hand 2/3 for a
    looping explanation, 1.0 for none and no value under two words; a run that also
    asks for a metric that compares with references keeps refusing each row."""
    table = tmp_path / "mine.csv"
    table.write_text("system,example_id,user_id,item_id,explanation\n"
                     "mine,e1,u1,i1,great sound great sound\n"  # bigrams (great sound) x2, (sound great): 2 of 3
                     "mine,e2,u1,i2,the strings buzz\n"         # 2 bigrams, both distinct
                     "mine,e3,u2,i1,fine\n")                   # no bigram: no value, never perfect
    out = tmp_path / "alone"
    rep = run_evaluate(EvaluateConfig(explanations=[str(table)], out=str(out), metrics=["distinct-2"]),
                       progress=lambda s: None)
    assert rep["counts"]["examples"] == 3 and rep["counts"]["errors"] == 0
    assert rep["counts"]["without_reference"] == 3
    scores = {r["example_id"]: r["value"] for r in pq.read_table(out / "scores.parquet").to_pylist()}
    assert scores["e1"] == pytest.approx(2 / 3) and scores["e2"] == 1.0
    assert scores.get("e3") is None or np.isnan(scores["e3"])

    out = tmp_path / "with_rouge"
    rep = run_evaluate(EvaluateConfig(explanations=[str(table)], out=str(out), metrics=["distinct-2", "rouge-1-f"]),
                       progress=lambda s: None)
    assert rep["counts"]["examples"] == 0 and rep["counts"]["errors"] == 3
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert {e["error_type"] for e in errors} == {"no_reference"}


def test_the_nli_app_the_job_starts_on_a_gpu_may_fall_to_zero(bench, tmp_path, monkeypatch):
    """The job's own NLI deployment (nli_service auto) on GPUs: min_replicas 0 once idle,
    one replica at the start; on CPUs as configured."""
    from rexeval.pipelines.evaluate.pipeline import NLIService
    from rexeval.serve import common, nli
    from rexeval.serve.leases import LeaseBook

    class Profile:
        def require(self, role):
            return "scripted"

    started = []
    monkeypatch.setattr(nli, "start_nli_service", lambda cfg, **kw: started.append(cfg))
    monkeypatch.setattr(common, "running_apps", lambda: set())
    monkeypatch.setattr(common, "serve_running", lambda: True)
    for gpus, want in ((0.5, (0, 1, 3)), (0.0, (1, None, 3))):
        service = NLIService(_cfg(bench, tmp_path / "out", nli_gpus=gpus, nli_replicas=3), Profile(), lambda _: None)
        service.lease = common.AppLease(nli.APP_NAME, "NLI", progress=lambda _: None, book=LeaseBook())
        service.address()
        cfg = started.pop()
        assert (cfg.min_replicas, cfg.initial_replicas, cfg.max_replicas) == want, gpus


@pytest.mark.slow
def test_a_metric_asked_by_name_is_the_only_one_of_its_family_reported(ray_session, bench, tmp_path):
    """`--metrics rouge-1-f --metrics usr`: one metric of the overlap family (twelve in all)
    and one corpus metric, not their families' every metric; the family named whole
    still gives all of them."""
    from rexeval.pipelines.evaluate.families import FAMILIES, asked_metrics

    assert asked_metrics(["rouge-1-f", "usr"]) == {"overlap": ("rouge-1-f",), "corpus": ("usr",)}
    assert asked_metrics(["overlap", "rouge-1-f"]) == {} and asked_metrics(["all", "usr"]) == {}
    out = tmp_path / "eval"
    rep = run_evaluate(_cfg(bench, out, metrics=["rouge-1-f", "usr"], limit=8), progress=lambda s: None)
    assert rep["families_run"] == ["overlap"]
    assert {m for _, m in _means(out)} == {"rouge-1-f", "usr"}
    assert set(pq.read_table(out / "scores.parquet").column("metric").to_pylist()) == {"rouge-1-f"}
    whole = tmp_path / "whole"
    run_evaluate(_cfg(bench, whole, metrics=["overlap"], limit=8), progress=lambda s: None)
    assert {m for _, m in _means(whole)} == set(FAMILIES["overlap"].metrics())


@pytest.mark.slow
def test_a_csv_and_a_gzipped_json_lines_table_under_other_names_score_as_the_parquet_one(ray_session, bench,
                                                                                         tmp_path):
    """A researcher's own explanations as CSV or gzipped JSON lines, under their own column
    names (`--columns`), give the Parquet table's scores, metric for metric."""
    import gzip

    import pyarrow.csv as pcsv

    theirs = {"example_id": "id", "system": "model", "explanation": "text"}
    table = pq.read_table(bench["explanations"])
    mine = table.rename_columns([theirs.get(c, c) for c in table.column_names])
    csv_path = tmp_path / "mine.csv"
    pcsv.write_csv(mine, csv_path)
    jsonl_path = tmp_path / "mine.jsonl.gz"
    jsonl_path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in mine.to_pylist()).encode()))

    def scores(path, columns):
        out = tmp_path / f"eval-{path.name}"
        run_evaluate(_cfg(bench, out, explanations=[str(path)], columns=columns, metrics=["overlap", "corpus"],
                          limit=8), progress=lambda s: None)
        return _means(out)

    want = scores(Path(bench["explanations"]), {})
    assert want and scores(csv_path, theirs) == pytest.approx(want)
    assert scores(jsonl_path, theirs) == pytest.approx(want)
