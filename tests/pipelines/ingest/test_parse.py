"""Ingest: every layout, every kind of bad row, chunking, and the Ray job end to end."""
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.ingest.formats import detect_layout
from rexeval.pipelines.ingest.parse import parse_chunk
from rexeval.pipelines.ingest.validate import normalise
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- issue 45: one bad row never sinks a job -------------------------------------------


def _ok_csv(user="A1", text="Fine"):
    return f'{user},B1,Ann,"[0, 0]",{text},5,S,1393545600,"02 28, 2014"\n'


def _errors_by_line(errors):
    return {e["line"]: e for e in errors.to_pylist()}


def test_times_out_of_range_are_error_rows_not_a_crash(tmp_path):
    """9.3e18 overflowed int64 in the cast and ended the job; a time must lie between 1970
    and 2100 (in seconds or milliseconds) and be finite."""
    bad = ["9.3e18", "10000000000000000000", "-5", "1e400", "NaN", "Infinity", "5000000000000", "4200000000"]
    lines = [json.dumps(_r2014("U0", "I1", 1400000000))]
    lines += [json.dumps(_r2014(f"U{i}", "I1", 0)).replace('"unixReviewTime": 0', f'"unixReviewTime": {b}')
              for i, b in enumerate(bad, 1)]
    lines.append(json.dumps(_r2014("U9", "I1", 1588687728923)))  # milliseconds: fine
    path = _write_lines(tmp_path / "t.json", lines)
    reviews, errors, records = _ingest_file(path)
    assert records == len(lines) == reviews.num_rows + errors.num_rows
    assert reviews.column("user_id").to_pylist() == ["U0", "U9"]
    got = _errors_by_line(errors)
    assert sorted(got) == list(range(2, 2 + len(bad)))
    assert all(e["field"] == "timestamp" for e in got.values())
    assert "after 2100" in got[2]["message"] and "before 1970" in got[4]["message"]


def test_truncated_gzip_keeps_the_rows_before_the_cut_and_adds_one_error_row(tmp_path):
    rows = [json.dumps(_r2014(f"U{i}", "I1", 1400000000 + i)) for i in range(2000)]
    whole = gzip.compress(("\n".join(rows) + "\n").encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[:len(whole) // 2])
    reviews, errors, records = _ingest_file(path)
    assert records == reviews.num_rows + errors.num_rows and reviews.num_rows > 100
    assert reviews.column("line").to_pylist() == list(range(1, reviews.num_rows + 1))
    (e,) = errors.to_pylist()
    assert e["error_type"] == "read_stopped" and e["line"] == reviews.num_rows + 1
    assert str(path) in e["message"] and "gzip data ends early" in e["message"]


def test_unclosed_quote_in_the_middle_of_a_csv_costs_its_own_row_only(tmp_path):
    """pyarrow read the rest of the range as one quoted field; the count check then
    raised. The range is read record by record instead: the row with the quote is an
    error row, the rows before and after it are reviews."""
    broken = 'A3,B1,Ann,"[0, 0]","unclosed text,5,S,1393545600,"x"\n'
    path = tmp_path / "q.csv"
    path.write_text(_ok_csv("A1") + _ok_csv("A2") + broken + _ok_csv("A4") + _ok_csv("A5"))
    reviews, errors, records = _ingest_file(path, "kaggle_csv")
    assert records == 5 and reviews.column("user_id").to_pylist() == ["A1", "A2", "A4", "A5"]
    assert reviews.column("line").to_pylist() == [1, 2, 4, 5]
    (e,) = errors.to_pylist()
    assert e["line"] == 3 and e["error_type"] == "invalid_csv" and "unclosed text" in e["raw"]


def test_unclosed_quote_at_the_end_of_a_csv_is_one_row_saying_where_reading_stopped(tmp_path):
    path = tmp_path / "end.csv"
    path.write_text(_ok_csv("A1") + _ok_csv("A2") + 'A3,B1,Ann,"[0, 0]","cut off\nin the middle\nof a')
    reviews, errors, records = _ingest_file(path, "kaggle_csv")
    assert records == 3 and reviews.column("user_id").to_pylist() == ["A1", "A2"]
    (e,) = errors.to_pylist()
    assert e["line"] == 3 and e["error_type"] == "read_stopped" and "never closed" in e["message"]


def test_binary_tail_keeps_the_rows_before_it_as_one_error_row(tmp_path):
    good = [json.dumps(_r2014(f"U{i}", "I1", 1400000000 + i)) for i in range(3)]
    path = tmp_path / "tail.json"
    path.write_bytes(("\n".join(good) + "\n").encode() + bytes(range(256)) * 40)
    reviews, errors, records = _ingest_file(path)
    assert records == 4 and reviews.num_rows == 3
    (e,) = errors.to_pylist()
    assert e["line"] == 4 and e["error_type"] == "read_stopped" and "binary data" in e["message"]


def test_a_stray_quote_costs_neither_rows_nor_the_plan(tmp_path, monkeypatch):
    """A quote inside an unquoted field is literal CSV, but it left the planner's quote
    count odd: the rest of the file became one range (all of a 10 GB file in one task)
    and its parse raised on the record count. Planning now gives up the quote scan after
    QUOTE_SCAN_BYTES, and a range with an odd count is read record by record."""
    from rexeval.pipelines.ingest import chunks

    monkeypatch.setattr(chunks, "QUOTE_SCAN_BYTES", 300)
    rows = [_ok_csv(f"A{i}", '5" speaker' if i == 1 else f"text {i}") for i in range(40)]
    path = tmp_path / "stray.csv"
    path.write_text("".join(rows))
    layout = detect_layout(path)
    assert len(plan_chunks([(str(path), layout)], 200)) > 5
    reviews, errors, records = _ingest_file(path, chunk_bytes=200)
    assert records == 40 and errors.num_rows == 0
    assert reviews.column("text").to_pylist()[:2] == ["text 0", '5" speaker']
    assert reviews.column("line").to_pylist() == list(range(1, 41))


def test_a_binary_file_is_refused_with_one_message_naming_it(tmp_path):
    import random

    noise = tmp_path / "noise.json"
    noise.write_bytes(random.Random(45).randbytes(50_000))
    png = tmp_path / "image.csv"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(2000))
    for path in (noise, png):
        with pytest.raises(ValueError, match=f"^{path}: not a text file.*--format"):
            detect_layout(path)
    # Read anyway: rows that all become error rows (or one), never a traceback.
    reviews, errors, records = _ingest_file(noise, "amazon2014")
    assert reviews.num_rows == 0 and records == errors.num_rows >= 1
    assert all(e["line"] >= 1 and e["source"] == str(noise) for e in errors.to_pylist())


def test_one_json_array_of_reviews_is_named_as_such_not_read_as_csv(tmp_path):
    """Before: "CSV layout not recognised (first row has 4 fields)" for a `.json` file."""
    records = [{"reviewerID": "u1", "asin": "i1", "overall": 5.0, "reviewText": "warm tone"}]
    path = tmp_path / "reviews.json"
    path.write_text("\ufeff  " + json.dumps(records, indent=1))
    with pytest.raises(ValueError, match=rf"^{path}: holds one JSON array, not JSON lines.*jq -c"):
        detect_layout(path)


def test_a_5mb_line_without_a_newline(tmp_path):
    """Detection reads a bounded prefix (the csv module raised on the long field); the
    parser makes the line one error row, its raw text clipped."""
    plain = tmp_path / "long.txt"
    plain.write_bytes(b"x" * (5 << 20))
    with pytest.raises(ValueError, match=f"^{plain}: no line end in its first"):
        detect_layout(plain)
    path = tmp_path / "long.json"
    path.write_bytes(b'{"reviewText": "' + b"x" * (5 << 20))
    with pytest.raises(ValueError, match=f"^{path}: "):
        detect_layout(path)
    reviews, errors, records = _ingest_file(path, "amazon2014")
    assert records == errors.num_rows == 1 and reviews.num_rows == 0
    (e,) = errors.to_pylist()
    assert e["line"] == 1 and e["error_type"] == "invalid_json" and len(e["raw"]) < 70_000


def test_a_csv_whose_first_record_has_a_quoted_newline_is_detected(tmp_path):
    path = tmp_path / "nl.csv"
    path.write_text(_ok_csv("A1", '"two\nlines"') + _ok_csv("A2"))
    assert detect_layout(path) == detect_layout(path, "kaggle_csv")
    reviews, errors, _ = _ingest_file(path)
    assert errors.num_rows == 0 and reviews.column("text").to_pylist() == ["two\nlines", "Fine"]


def test_a_long_first_csv_field_is_detected(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text(_ok_csv("A1", "word " * 40_000))  # beyond the csv module's field limit
    assert detect_layout(path) == detect_layout(path, "kaggle_csv")


def test_byte_order_mark_is_dropped_before_detection_and_parsing(tmp_path):
    bom = b"\xef\xbb\xbf"
    js = tmp_path / "bom.json"
    js.write_bytes(bom + (json.dumps(_r2014("U1", "I1", 1400000000)) + "\n").encode())
    for fmt in ("auto", "amazon2014"):
        reviews, errors, _ = _ingest_file(js, fmt)
        assert errors.num_rows == 0 and reviews.column("user_id").to_pylist() == ["U1"]
    for name, header in (("bom.csv", ""), ("hdr.csv", ",".join(["reviewerID", "asin", "reviewerName", "helpful",
                                                                 "reviewText", "overall", "summary",
                                                                 "unixReviewTime", "reviewTime"]) + "\r\n")):
        path = tmp_path / name
        path.write_bytes(bom + (header + _ok_csv("A1").replace("\n", "\r\n")).encode())
        reviews, errors, _ = _ingest_file(path)
        assert errors.num_rows == 0 and reviews.column("user_id").to_pylist() == ["A1"]


def test_crlf_line_ends(tmp_path):
    js = tmp_path / "crlf.json"
    js.write_bytes(b"\r\n".join(json.dumps(_r2014(f"U{i}", "I1", 1400000000 + i)).encode() for i in range(3)) + b"\r\n")
    reviews, errors, _ = _ingest_file(js, chunk_bytes=50)
    assert errors.num_rows == 0 and reviews.column("line").to_pylist() == [1, 2, 3]
    csv_ = tmp_path / "crlf.csv"
    csv_.write_bytes((_ok_csv("A1", '"a\r\nb"') + _ok_csv("A2")).replace("\n", "\r\n").encode())
    reviews, errors, _ = _ingest_file(csv_)
    assert errors.num_rows == 0 and reviews.column("user_id").to_pylist() == ["A1", "A2"]


def test_wrong_json_types_are_error_rows_naming_the_field(tmp_path):
    """A list text was stored as its first element; a dict rating as its repr. Each is
    an error row naming the field; 2014's helpful [votes, total] stays a layout."""
    cases = [("reviewText", ["a", "b"], "text"), ("overall", {"stars": 5}, "rating"),
             ("unixReviewTime", [1400000000], "timestamp"), ("reviewerID", {"id": 1}, "user_id"),
             ("asin", True, "item_id"), ("summary", ["s"], "summary"), ("helpful", {"up": 1}, "helpful_votes"),
             ("overall", True, "rating")]
    lines = [json.dumps(_r2014("U0", "I1", 1400000000, helpful=[3, 4]))]
    lines += [json.dumps({**_r2014(f"U{i}", "I1", 1400000000), key: value}) for i, (key, value, _) in enumerate(cases, 1)]
    path = _write_lines(tmp_path / "types.json", lines)
    reviews, errors, records = _ingest_file(path)
    assert records == len(lines) and reviews.column("helpful_votes").to_pylist() == [3]
    got = _errors_by_line(errors)
    for line, (key, _, fld) in enumerate(cases, 2):
        assert got[line]["error_type"] == "invalid_type" and got[line]["field"] == fld, got[line]
        assert f"'{key}'" in got[line]["message"]


def test_undecodable_json_values_are_error_rows(tmp_path):
    """Nesting too deep for the decoder and lone surrogate escapes raised past the parser."""
    lines = ["[" * 100_000, json.dumps(_r2014("U1", "I1", 1400000000, text="bad \ud800 half")),
             json.dumps(_r2014("U2", "I1", 1400000000, text="emoji \U0001F600"))]
    path = _write_lines(tmp_path / "odd.json", lines)
    reviews, errors, records = _ingest_file(path, "amazon2014")
    assert records == 3 and reviews.column("text").to_pylist() == ["emoji \U0001F600"]
    got = _errors_by_line(errors)
    assert got[1]["error_type"] == "invalid_json" and got[2]["field"] == "text"


def test_parquet_column_of_the_wrong_type_is_refused_and_times_need_not_be_whole(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"user_id": ["u"], "item_id": ["i"], "rating": [5.0], "text": [["a", "b"]],
                             "timestamp": pa.array([1_400_000_000_500], pa.timestamp("ms"))}), path)
    with pytest.raises(ValueError, match="column 'text' is list<.*cannot hold text"):
        detect_layout(path)
    pq.write_table(pa.table({"user_id": ["u"], "item_id": ["i"], "rating": [5.0], "text": ["ok"],
                             "timestamp": pa.array([1_400_000_000_500], pa.timestamp("ms"))}), path)
    reviews, errors, _ = _ingest_file(path)
    assert errors.num_rows == 0 and reviews.column("timestamp").to_pylist() == [1_400_000_000]


@pytest.mark.slow
def test_ingest_job_on_a_truncated_gzip_ends_with_error_rows(tmp_path, ray_session):
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig

    rows = [json.dumps(_r2014(f"U{i}", "I1", 1400000000 + i)) for i in range(3000)]
    whole = gzip.compress(("\n".join(rows) + "\n").encode())
    src = tmp_path / "cut.json.gz"
    src.write_bytes(whole[:len(whole) * 2 // 3])
    m = run_ingest(IngestConfig(inputs=[str(src)], out=str(tmp_path / "out")), progress=lambda s: None)
    c = m["counts"]
    assert c["in"] == c["out"] + c["errors"] and c["errors"] == 1 and c["out"] > 1000
    (e,) = pq.read_table(tmp_path / "out" / "errors").to_pylist()
    assert e["error_type"] == "read_stopped" and e["line"] == c["out"] + 1 and e["source"] == str(src)
