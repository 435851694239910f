"""The study report's evaluate section shows the job's metric agreement (the tables of
metric_correlations.md and its heat maps); an evaluate folder without them (written
before they existed) gives the section as before, with no note."""
import pyarrow as pa

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import SCORE_AGGREGATES, SCORES
from rexeval.pipelines.evaluate.correlations import write_metric_correlations
from rexeval.pipelines.study.report_model import Builder, Instance
from rexeval.pipelines.study.report_sections import section_evaluate


def _plant(folder, with_correlations: bool) -> Instance:
    folder.mkdir()
    # Three systems; BLEU-1 means 1, 2, 3 and ROUGE-1 means 1, 3, 2: pairs (s1,s2) C,
    # (s1,s3) C, (s2,s3) D: tau = (2 - 1) / 3 = 1/3, shown as 0.33.
    agg = [(s, m, v) for s, b, r in (("s1", 1, 1), ("s2", 2, 3), ("s3", 3, 2)) for m, v in (("bleu-1", b),
                                                                                          ("rouge-1-f", r))]
    write_parquet_atomic(folder / "aggregates.parquet", pa.Table.from_pylist(
        [{"system": s, "metric": m, "mean": float(v), "std": None, "n": 1, "n_missing": 0, "ci_low": None,
          "ci_high": None, "kind": "per_example"} for s, m, v in agg], schema=SCORE_AGGREGATES))
    write_parquet_atomic(folder / "scores.parquet", pa.Table.from_pylist(
        [{"example_id": "e0", "system": s, "metric": m, "value": float(v)} for s, m, v in agg], schema=SCORES))
    (folder / "tables.md").write_text("### n-gram and feature metrics\n\n| Dataset | Metric | s1 |\n|---|---|---|\n"
                                      "| toy | BLEU-1 | 1.0000 |\n")
    (folder / "report.json").write_text('{"counts": {"examples": 3}}')
    if with_correlations:
        write_metric_correlations(folder, dataset="toy", progress=lambda s: None)
    return Instance(name="ev", step="evaluate", job="evaluate", dataset="toy", out=folder, status="complete",
                    reason=None, fingerprint=None, settings={}, seconds=1.0, finished=None, summary=None)


def test_evaluate_section_shows_metric_agreement(tmp_path):
    inst = _plant(tmp_path / "ev", with_correlations=True)
    sec = section_evaluate(Builder(tmp_path, [inst]), inst)
    corr = [t for t in sec.tables if t.title.startswith("Kendall τ over")]
    assert [t.title for t in corr] == ["Kendall τ over systems: toy (ev)", "Kendall τ over examples: toy (ev)"]
    assert corr[0].columns == ["Metric", "BLEU-1"] and corr[0].rows == [["ROUGE-1", "0.33"]]
    assert [f.title for f in sec.figures] == ["Kendall τ between metrics over examples (ev)",
                                              "Kendall τ between metrics over systems (ev)"]
    assert not sec.notes


def test_evaluate_section_without_correlation_files_is_unchanged(tmp_path):
    inst = _plant(tmp_path / "ev", with_correlations=False)
    sec = section_evaluate(Builder(tmp_path, [inst]), inst)
    assert not any("Kendall" in t.title for t in sec.tables) and not sec.figures and not sec.notes
