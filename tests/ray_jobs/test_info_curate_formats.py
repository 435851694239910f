"""`rexeval info` and `rexeval curate` read a reviews table in any format (issue 50,
item 1): a CSV and a gzipped JSON-lines file under other column names, mapped with
--columns, give the Parquet file's statistics and curation; a missing column names the
file, the format read and the columns found. The curation's planted purchases are
`tests/pipelines/curate`'s."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from rexeval.pipelines.core.schema import REVIEWS, validate_table
from rexeval.ray_jobs.cli import cli
from tests.pipelines.curate.test_curate import planted

pytestmark = pytest.mark.slow
THEIRS = {"user_id": "reviewer", "item_id": "asin", "item_title": "name", "timestamp": "time"}  # ours -> theirs
MAPPING = ",".join(f"{o}={t}" for o, t in THEIRS.items())


def _write(frame: pd.DataFrame, path, columns=None) -> str:
    df = frame.rename(columns={ours: theirs for ours, theirs in (columns or {}).items()})
    name = str(path)
    if name.endswith(".parquet"):
        table = validate_table(pa.Table.from_pandas(frame, preserve_index=False), REVIEWS)
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif name.endswith(".csv"):
        df.to_csv(path, index=False)
    else:
        df = df.astype(object).where(df.notna(), None)  # missing as null, not NaN
        lines = "".join(json.dumps(r) + "\n" for r in df.to_dict("records"))
        path.write_bytes(gzip.compress(lines.encode()))
    return name


def _run(args):
    res = CliRunner().invoke(cli, args)
    return res


@pytest.mark.parametrize("name", ["reviews.csv", "reviews.jsonl.gz"])
def test_info_and_curate_read_csv_and_gzipped_json_lines_under_other_names(tmp_path, ray_session, name):
    frame, _ = planted()
    want_src = _write(frame, tmp_path / "reviews.parquet")
    src = _write(frame, tmp_path / name, THEIRS)
    want = _run(["info", want_src, "--json", "--name", "d"])
    got = _run(["info", src, "--json", "--name", "d", "--columns", MAPPING])
    assert want.exit_code == 0 and got.exit_code == 0, (want.output, got.output)
    assert json.loads(got.output) == json.loads(want.output)
    assert json.loads(got.output)["d"]
    runs = {}
    for label, path, extra in (("parquet", want_src, []), ("mine", src, ["--columns", MAPPING])):
        res = _run(["curate", path, "--out", str(tmp_path / label), "--per-category", "2", "--seed", "3", *extra])
        assert res.exit_code == 0, res.output
        runs[label] = (pd.read_parquet(tmp_path / label / "reviews"),
                       json.loads((tmp_path / label / "manifest.json").read_text()))
    (want_kept, want_m), (got_kept, got_m) = runs["parquet"], runs["mine"]
    assert got_m["counts"] == want_m["counts"] and got_m["categories"] == want_m["categories"]
    pd.testing.assert_frame_equal(got_kept.drop(columns=["source"]), want_kept.drop(columns=["source"]))
    # no mapping: the settings' hash is the one before --columns existed
    assert "columns" not in json.dumps(want_m["config_hash"]) and want_m["config"]["columns"] == {}


def test_a_missing_column_or_unknown_format_is_named(tmp_path, ray_session):
    frame, _ = planted()
    src = _write(frame, tmp_path / "reviews.jsonl.gz", THEIRS)
    for args in (["info", src], ["curate", src, "--out", str(tmp_path / "c")]):
        res = _run(args)
        assert res.exit_code != 0
        out = " ".join(res.output.split())
        assert src in out and "JSON-lines file" in out and "columns found:" in out and "reviewer" in out, out
    odd = tmp_path / "reviews.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    for args in (["info", str(odd)], ["curate", str(odd), "--out", str(tmp_path / "d")]):
        res = _run(args)
        assert res.exit_code != 0 and str(odd) in " ".join(res.output.split()), res.output
