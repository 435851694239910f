"""`rexeval cluster` and `rexeval cluster-report` as a user runs them."""
from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from rexeval.ray_jobs.paraphrase import cluster_cmd, cluster_report_cmd
from tests.pipelines.paraphrase.test_pipeline import _statements


def test_help_explains_the_method_and_has_examples():
    res = CliRunner().invoke(cluster_cmd, ["--help"])
    assert res.exit_code == 0
    for text in ("rexeval cluster runs/mi/star", "--method", "--tau-pair", "--cross-threshold",
                 "--tau-intra", "--tau-remerge", "--index", "--bi-encoder-only", "--config"):
        assert text in res.output


def test_usage_errors_are_one_clear_line(tmp_path, ray_session):
    res = CliRunner().invoke(cluster_cmd, [str(tmp_path), "--out", "o", "--method", "kmeans"])
    assert res.exit_code == 2 and "kmeans" in res.output
    res = CliRunner().invoke(cluster_cmd, [str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "statements input not found" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(cluster_cmd, [str(tmp_path), "--out", "o", "--cross-kind", "magic"])
    assert res.exit_code == 2 and "cross_kind" in res.output
    src = _statements(tmp_path / "st.parquet")
    res = CliRunner().invoke(cluster_cmd, [str(src), "--out", str(tmp_path / "o"),
                                           "--model", "cross_encoder=" + str(tmp_path / "missing")])
    assert res.exit_code == 2 and "cross_encoder" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_yaml_config_flags_win_and_report_compares_runs(tmp_path, ray_session):
    src = _statements(tmp_path / "st.parquet")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"input": str(src), "out": str(tmp_path / "star"), "tau_pair": 0.99}))
    res = CliRunner().invoke(cluster_cmd, ["--config", str(cfg), "--tau-pair", "0.9"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "star" / "manifest.json").read_text())
    assert manifest["config"]["tau_pair"] == 0.9
    assert "clusters" in res.output and "reduction %" in res.output and "bi-encoder only" in res.output
    res = CliRunner().invoke(cluster_cmd, [str(src), "--out", str(tmp_path / "extra"), "--method", "extra"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cluster_report_cmd, [str(tmp_path / "extra"), str(tmp_path / "star"),
                                                  "--dataset", "toy", "--csv", str(tmp_path / "t3.csv")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("| Dataset | Method | #Clust. | Red.% | SSE")
    # EXTRA knows no polarity: the positive and negative "the strings sound bright" merge.
    assert lines[2].startswith("| toy | EXTRA | 8 | 11.11 |")
    assert lines[3].startswith("|  | STAR | 5 | 44.44 |")
    assert (tmp_path / "t3.csv").read_text().startswith("dataset,method,statements,clusters")
    res = CliRunner().invoke(cluster_report_cmd, [str(tmp_path)])
    assert res.exit_code == 2 and "report.json" in res.output


@pytest.mark.slow
def test_input_out_and_report_may_be_uris(tmp_path, s3_root, ray_session):
    from rexeval.storage import location

    src = f"{s3_root}/in/st.parquet"
    location(src).upload(_statements(tmp_path / "st.parquet"))
    for method in ("star", "extra"):
        res = CliRunner().invoke(cluster_cmd, [src, "--out", f"{s3_root}/{method}", "--method", method])
        assert res.exit_code == 0, res.output
        assert f"{s3_root}/{method}/clusters" in res.output
    res = CliRunner().invoke(cluster_report_cmd, [f"{s3_root}/extra", f"{s3_root}/star", "--dataset", "toy",
                                                  "--csv", f"{s3_root}/t3.csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[2].startswith("| toy | EXTRA | 8 | 11.11 |") and lines[3].startswith("|  | STAR | 5 | 44.44 |")
    csv = location(f"{s3_root}/t3.csv").read_text()
    assert csv.startswith("dataset,method,statements,clusters,reduction_pct,sse,ssb\r\ntoy,EXTRA,9,8,")
    res = CliRunner().invoke(cluster_report_cmd, [f"{s3_root}/nothing-here"])
    assert res.exit_code == 2 and "does not exist" in res.output
