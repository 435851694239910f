"""Ingest: every layout, every kind of bad row, chunking, and the Ray job end to end."""
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.ingest.formats import detect_layout
from rexeval.pipelines.ingest.parse import normalise, parse_chunk
from rexeval.pipelines.ingest.chunks import plan_chunks
from rexeval.pipelines.core.ids import review_ids


def _ingest_file(path, fmt="auto", columns=None, chunk_bytes=1 << 30, **kw):
    """Parse + validate without Ray (the pure part of the parse stage)."""
    layout = detect_layout(path, fmt, columns)
    reviews, errors, records = [], [], 0
    for chunk in plan_chunks([(str(path), layout)], chunk_bytes):
        parsed = parse_chunk(chunk)
        r, e = normalise(parsed, **kw)
        reviews.append(r)
        errors.append(e)
        records += parsed.records
    return pa.concat_tables(reviews), pa.concat_tables(errors), records


def _r2014(user, item, t, text="Great strings, warm tone.", rating=5.0, **extra):
    return {"reviewerID": user, "asin": item, "reviewerName": "Ann", "helpful": [2, 3],
            "reviewText": text, "overall": rating, "summary": "nice", "unixReviewTime": t,
            "reviewTime": "01 01, 2014", **extra}


def _write_lines(path, lines, gz=False):
    data = "\n".join(lines).encode() + b"\n"
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path


def test_amazon2014_json_and_gzip_and_python_literals(tmp_path):
    rows = [_r2014("U1", "I1", 1400000000), _r2014("U2", "I1", 1400000100, rating=2.0)]
    lines = [json.dumps(r) for r in rows] + [repr(_r2014("U3", "I2", 1400000200))]
    plain = _write_lines(tmp_path / "r.json", lines)
    gz = _write_lines(tmp_path / "r.json.gz", lines, gz=True)
    for path in (plain, gz):
        assert detect_layout(path).format == "json"
        reviews, errors, records = _ingest_file(path)
        assert records == 3 and errors.num_rows == 0
        assert reviews.column("user_id").to_pylist() == ["U1", "U2", "U3"]
        assert reviews.column("rating").to_pylist() == [5.0, 2.0, 5.0]
        assert reviews.column("helpful_votes").to_pylist() == [2, 2, 2]
        assert reviews.column("line").to_pylist() == [1, 2, 3]


def test_amazon2018_vote_strings(tmp_path):
    row = _r2014("U1", "I1", 1500000000, vote="1,234", verified=True, style={"Size:": "M"})
    del row["helpful"]
    path = _write_lines(tmp_path / "r18.json", [json.dumps(row)])
    reviews, errors, _ = _ingest_file(path)
    assert errors.num_rows == 0 and reviews.column("helpful_votes").to_pylist() == [1234]


def test_amazon2023_jsonl(tmp_path):
    rows = [{"rating": 4.0, "title": "Solid", "text": "Fits well, soft cotton.", "images": [],
             "asin": "B01", "parent_asin": "P01", "user_id": "AGX", "timestamp": 1588687728923,
             "helpful_vote": 3, "verified_purchase": True}]
    path = _write_lines(tmp_path / "r.jsonl", [json.dumps(r) for r in rows])
    reviews, errors, _ = _ingest_file(path)
    assert errors.num_rows == 0
    r = reviews.to_pylist()[0]
    assert r["item_id"] == "P01" and r["timestamp"] == 1588687728  # ms -> s
    assert r["summary"] == "Solid" and r["helpful_votes"] == 3


def test_kaggle_csv_layout(tmp_path):
    lines = ['A1,B1,"Ann ""the"" player","[1, 2]","Bright, clear sound.",5,Good,1393545600,"02 28, 2014"',
             'A2,B1,Bob,"[0, 0]","Muddy tone",2,Meh,1393545601,"02 28, 2014"']
    path = _write_lines(tmp_path / "k.csv", lines)
    layout = detect_layout(path)
    assert layout.csv_columns is not None and not layout.has_header
    reviews, errors, records = _ingest_file(path)
    assert records == 2 and errors.num_rows == 0
    assert reviews.column("user_name").to_pylist() == ['Ann "the" player', "Bob"]
    assert reviews.column("helpful_votes").to_pylist() == [1, 0]


def test_csv_with_header_and_columns_mapping(tmp_path):
    path = _write_lines(tmp_path / "any.csv", [
        "who,what,stars,body,when", "u1,i1,4,Comfy shoes,2019-05-01", "u2,i1,5,Great,1556668800"])
    cols = {"user_id": "who", "item_id": "what", "rating": "stars", "text": "body", "timestamp": "when"}
    reviews, errors, records = _ingest_file(path, "csv", cols)
    assert records == 2 and errors.num_rows == 0
    assert reviews.column("timestamp").to_pylist() == [1556668800, 1556668800]
    assert reviews.column("line").to_pylist() == [2, 3]


def test_csv_with_header_in_many_chunks(tmp_path):
    rows = [f"u{i},i{i % 3},{1 + i % 5},text number {i},{1556668800 + i}" for i in range(40)]
    path = _write_lines(tmp_path / "h.csv", ["user_id,item_id,rating,text,timestamp"] + rows)
    whole, _, n1 = _ingest_file(path, "csv")
    pieces, errors, n2 = _ingest_file(path, "csv", chunk_bytes=64)
    assert n1 == n2 == 40 and errors.num_rows == 0 and whole.equals(pieces)
    assert pieces.column("line").to_pylist() == list(range(2, 42))


def test_headerless_csv_by_position(tmp_path):
    path = _write_lines(tmp_path / "pos.csv", ["u1,i1,3,Okay case,1556668800"])
    cols = {"user_id": "0", "item_id": "1", "rating": "2", "text": "3", "timestamp": "4"}
    reviews, errors, _ = _ingest_file(path, "csv", cols)
    assert errors.num_rows == 0 and reviews.column("text").to_pylist() == ["Okay case"]


def test_parquet_with_columns(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"u": ["x", "y"], "i": ["a", "b"], "r": [5, 9], "t": ["Nice", "Bad"],
                             "ts": [1600000000, 1600000001]}), path)
    cols = {"user_id": "u", "item_id": "i", "rating": "r", "text": "t", "timestamp": "ts"}
    reviews, errors, records = _ingest_file(path, "auto", cols)
    assert records == 2 and reviews.num_rows == 1
    e = errors.to_pylist()[0]
    assert e["line"] == 2 and e["field"] == "rating" and "out of range" in e["message"]


def test_parquet_without_required_mapping_says_what_is_missing(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"u": ["x"]}), path)
    with pytest.raises(ValueError, match="required field.*user_id.*--columns"):
        detect_layout(path)


def test_every_bad_row_ends_in_errors_with_line_and_reason(tmp_path):
    good = _r2014("U1", "I1", 1400000000)
    lines = [
        json.dumps(good),                                    # 1 ok
        '{"reviewerID": "U2", "asin": ',                    # 2 invalid JSON
        json.dumps({k: v for k, v in _r2014("U3", "I1", 1).items() if k != "asin"}),  # 3 missing item
        json.dumps(_r2014("U4", "I1", 1400000000, text="   ")),                      # 4 empty text
        json.dumps(_r2014("U5", "I1", 1400000000, rating=7.0)),                      # 5 out of range
        "",                                                  # 6 blank: not a row
        json.dumps(_r2014("U6", "I1", "yesterday")),         # 7 bad timestamp
        json.dumps(_r2014("U7", "I1", 1400000000, rating="five")),                   # 8 bad rating
    ]
    path = tmp_path / "bad.json"
    data = ("\n".join(lines) + "\n").encode()
    data += b'{"reviewerID": "U8", "asin": "I1", "reviewText": "caf\xe9", "overall": 5, "unixReviewTime": 1}\n'  # 9
    path.write_bytes(data)
    reviews, errors, records = _ingest_file(path)
    assert records == 8  # blank line excluded
    assert reviews.num_rows + errors.num_rows == records
    got = {e["line"]: (e["error_type"], e["field"], e["message"]) for e in errors.to_pylist()}
    assert got[2][0] == "invalid_json"
    assert got[3][1] == "item_id" and "missing" in got[3][2]
    assert got[4] == ("invalid_field", "text", "empty text")
    assert got[5][1] == "rating" and "out of range" in got[5][2]
    assert got[7][1] == "timestamp"
    assert got[8][1] == "rating" and "not a number" in got[8][2]
    assert got[9][0] == "invalid_utf8"
    assert all(e["raw"] for e in errors.to_pylist())


def test_csv_bad_rows(tmp_path):
    ok = 'A1,B1,Ann,"[0, 0]",Fine,5,S,1393545600,"02 28, 2014"'
    data = (ok + "\n" + "A2,B1,too,few\n" + 'A3,B1,Ann,"[0, 0]",Text,0,S,1393545600,"x"\n').encode()
    data += b'A4,B1,Ann,"[0, 0]",Bad \xff bytes,5,S,1393545600,"x"\n'
    path = tmp_path / "k.csv"
    path.write_bytes(data)
    reviews, errors, records = _ingest_file(path, "kaggle_csv")
    assert records == 4 and reviews.num_rows == 1
    got = {e["line"]: e for e in errors.to_pylist()}
    assert got[2]["error_type"] == "invalid_csv" and "found 4" in got[2]["message"]
    assert got[3]["field"] == "rating"
    assert got[4]["error_type"] == "invalid_utf8" and got[4]["field"] == "reviewText"


def test_csv_chunks_respect_quoted_newlines(tmp_path):
    rows = []
    for i in range(60):
        text = f'line one of {i}\nline ""two"" of {i}' if i % 3 == 0 else f"plain {i}"
        text = text.replace('"', '""')
        rows.append(f'U{i},B{i % 5},N,"[0, 0]","{text}",4,S,{1393545600 + i},"d"')
    path = _write_lines(tmp_path / "nl.csv", rows)
    whole, e1, n1 = _ingest_file(path, "kaggle_csv")
    pieces, e2, n2 = _ingest_file(path, "kaggle_csv", chunk_bytes=97)
    assert n1 == n2 == 60 and e1.num_rows == e2.num_rows == 0
    assert whole.equals(pieces)
    # Physical lines: each multi-line review takes two lines of the file.
    assert whole.column("line").to_pylist()[:3] == [1, 3, 4]


def test_review_id_is_a_stable_hash():
    a = review_ids(["u"], ["i"], [1])[0]
    assert a == review_ids(["u"], ["i"], [1])[0] and len(a) == 16
    assert a != review_ids(["u"], ["i"], [2])[0]


# -- the Ray job ---------------------------------------------------------------------


def _noisy_file(tmp_path):
    rows = [_r2014(f"U{i}", f"I{i % 4}", 1400000000 + i) for i in range(30)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(10, json.dumps(rows[3]))  # duplicate of line 4
    lines.insert(20, "{broken")
    return _write_lines(tmp_path / "noisy.json", lines)


def test_ingest_job_counts_duplicates_and_titles(tmp_path, ray_session):
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig

    src = _noisy_file(tmp_path)
    meta = _write_lines(tmp_path / "meta.json", [repr({"asin": "I1", "title": "Nylon strings"}),
                                                 json.dumps({"asin": "I2", "title": "Capo"})])
    cfg = IngestConfig(inputs=[str(src)], out=str(tmp_path / "out"), meta=[str(meta)],
                       chunk_mb=0.001, category="instruments")
    m = run_ingest(cfg, progress=lambda s: None)
    assert m["counts"] == {"in": 32, "out": 30, "errors": 2}
    errors = pq.read_table(tmp_path / "out" / "errors").to_pylist()
    dup = next(e for e in errors if e["error_type"] == "duplicate")
    assert dup["line"] == 11 and "line 4" in dup["message"]
    reviews = pq.read_table(tmp_path / "out" / "reviews")
    titles = dict(zip(reviews.column("item_id").to_pylist(), reviews.column("item_title").to_pylist()))
    assert titles["I1"] == "Nylon strings" and titles["I2"] == "Capo" and titles["I0"] is None
    assert set(reviews.column("category").to_pylist()) == {"instruments"}


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_stage" not in p.parts}


def test_interrupted_ingest_resumes_to_identical_output(tmp_path, ray_session):
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig

    src = _noisy_file(tmp_path)
    a = IngestConfig(inputs=[str(src)], out=str(tmp_path / "a"), chunk_mb=0.001)
    run_ingest(a, progress=lambda s: None)
    reference = _tree_bytes(tmp_path / "a")
    assert len([k for k in reference if k.startswith("reviews/")]) >= 3

    b = IngestConfig(inputs=[str(src)], out=str(tmp_path / "b"), chunk_mb=0.001)
    run_ingest(b, progress=lambda s: None)
    # Put the folder in the states a crash can leave: the later shards of both steps
    # missing, one shard written without its marker, a stray temporary file.
    root = tmp_path / "b"
    assert not (root / "_stage").exists()  # parse-stage files are cleaned up at the end
    for marker in sorted((root / "_done").glob("*.json"))[1:]:
        marker.unlink()
    for table in ("reviews", "errors"):
        for part in sorted((root / table).glob("part-*.parquet"))[2:]:
            part.unlink()
    (root / "reviews" / ".part-00009.parquet.123.tmp").write_bytes(b"half")
    m = json.loads((root / "manifest.json").read_text())
    m["status"] = "running"
    (root / "manifest.json").write_text(json.dumps(m))
    lines = []
    run_ingest(b, progress=lines.append)
    assert any("resuming: 1 of" in l for l in lines)
    # A complete output is not recomputed.
    again = []
    run_ingest(b, progress=again.append)
    assert any("already complete" in l for l in again)
    (root / "reviews" / ".part-00009.parquet.123.tmp").unlink()
    assert _tree_bytes(root) == reference


@pytest.mark.slow
def test_shared_csv_ingests_without_silent_drops(tmp_path, ray_session, shared_csv):
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig

    m = run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(tmp_path / "mi"), chunk_mb=1),
                   progress=lambda s: None)
    c = m["counts"]
    physical = sum(1 for line in open(shared_csv, "rb") if line.strip())
    assert c["in"] == physical == 5050
    assert c["in"] == c["out"] + c["errors"]
    reviews = pq.read_table(tmp_path / "mi" / "reviews")
    errors = pq.read_table(tmp_path / "mi" / "errors")
    assert reviews.num_rows == c["out"] and errors.num_rows == c["errors"]
    assert reviews.column("user_id").unique().__len__() > 1300
