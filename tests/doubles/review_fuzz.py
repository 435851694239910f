"""Malformed review files for fuzzing ingest, and the check every one of them must pass.

Shared by tests/pipelines/ingest/test_fuzz.py (a few hundred examples in CI) and
benchmarks/bench_ingest_fuzz.py (thousands). A file is built from a list of records we
wrote ourselves, so what should come out is known without asking the parser:

- JSON lines (the 2014 Amazon layout) or the headerless Kaggle CSV;
- each record valid (in one of the accepted spellings: Python literal, integer ids,
  milliseconds, date strings, a mid-file byte order mark, a 200 KB text) or broken
  in a known way (bad JSON, wrong types, extreme numbers, missing or empty fields,
  NUL bytes, lone surrogates, deep nesting, unclosed or stray quotes, wrong field
  counts, invalid UTF-8) or hit by random stray bytes (outcome unknown);
- the file with or without a byte order mark, CRLF line ends, a final line end,
  blank lines, gzip (whole or cut short), a binary tail, and cut into tasks of a
  few dozen bytes or whole.

`check` runs the pure ingest functions (detect_layout -> plan_file -> parse_chunk ->
normalise) on a file and returns the properties it broke; see its docstring.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

FORMATS = {"json": "amazon2014", "csv": "kaggle_csv"}
BOM = b"\xef\xbb\xbf"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"

# Kinds of record. "ok*" must come out as a review with the values written; the broken
# kinds must not; "unknown" (random stray bytes) may go either way.
JSON_KINDS = ["ok"] * 8 + ["ok_literal", "ok_int_ids", "ok_bom", "ok_long", "bad_json", "wrong_type",
                           "extreme", "missing", "empty_text", "not_object", "deep", "nul",
                           "surrogate", "long_garbage", "stray"]
CSV_KINDS = ["ok"] * 8 + ["ok_long", "wrong_count", "extreme", "missing", "empty_text", "bad_utf8",
                          "unclosed_quote", "stray_quote", "stray", "nul"]
LONG = 200_000  # characters: longer than the csv module's default field limit


@dataclass
class Record:
    """One record as written: its bytes (line end included) and, when it is valid, the
    values a review must carry."""

    index: int
    kind: str
    data: bytes
    user: str = ""
    item: str = ""
    rating: float = 0.0
    timestamp: int = 0
    text: str = ""
    breaks_quotes: bool = False  # CSV: the records after it may be read differently

    @property
    def valid(self) -> bool:
        return self.kind.startswith("ok")

    @property
    def invalid(self) -> bool:
        return not self.valid and self.kind not in ("unknown", "blank")


@dataclass
class FuzzFile:
    """A generated review file: records, file-level damage, and its bytes."""

    layout: str  # "json" | "csv"
    records: list[Record]
    bom: bool = False
    crlf: bool = False
    gz: bool = False
    cut: float | None = None  # gzip: the fraction of compressed bytes kept
    tail: bytes = b""  # binary garbage after the last record
    chunk_bytes: int = 1 << 20
    content: bytes = b""  # the text a reader sees (decompressed, whole)
    offsets: list[int] = field(default_factory=list)  # where each record starts in content
    ends: list[int] = field(default_factory=list)  # where it ends, its line end included (-1: none)
    data: bytes = b""  # the file's bytes

    @property
    def name(self) -> str:
        return f"reviews.{self.layout}" + (".gz" if self.gz else "")

    def describe(self) -> str:
        kinds = ",".join(r.kind for r in self.records)
        return (f"{self.name} bom={self.bom} crlf={self.crlf} cut={self.cut} tail={len(self.tail)}B "
                f"chunk={self.chunk_bytes} records=[{kinds}]")


# -- strategies ----------------------------------------------------------------------

_TEXT_CHARS = st.one_of(st.characters(exclude_categories=("Cs", "Cc")),
                        st.sampled_from(list(",\"' \n{}[]\\é€😀")))
texts = st.text(_TEXT_CHARS, min_size=1, max_size=30).filter(lambda t: t.strip())


@st.composite
def _times(draw) -> tuple[object, int]:
    """A valid review time as written (seconds, milliseconds, a float, a numeric or a
    date string) and the whole seconds it means."""
    secs = draw(st.integers(0, 4_000_000_000))
    how = draw(st.sampled_from(["s", "ms", "float", "str", "date"]))
    if how == "ms":
        ms = max(secs * 1000 + draw(st.integers(0, 999)), 100_000_000_000)
        return ms, ms // 1000
    if how == "float":
        return secs + 0.5, secs
    if how == "str":
        return str(secs), secs
    if how == "date":
        day = secs - secs % 86400
        return str(np.datetime_as_string(np.datetime64(day, "s"), unit="D")), day
    return secs, secs


_RATINGS = [1, 2, 3, 4, 5, 1.0, 4.5, "4", " 3 ", "2.0", "+5"]


@st.composite
def _valid_values(draw, i: int) -> dict:
    t_written, t = draw(_times())
    rating = draw(st.sampled_from(_RATINGS))
    return {"user": f"U{i}", "item": f"I{draw(st.integers(0, 3))}", "rating": rating,
            "rating_value": float(str(rating).strip()), "time": t_written, "timestamp": t,
            "text": draw(texts), "votes": draw(st.lists(st.integers(0, 50), min_size=2, max_size=2))}


def _json_dict(v: dict) -> dict:
    return {"reviewerID": v["user"], "asin": v["item"], "reviewerName": "Ann", "helpful": v["votes"],
            "reviewText": v["text"], "overall": v["rating"], "summary": "sum",
            "unixReviewTime": v["time"], "reviewTime": "01 1, 2014"}


_WRONG = [["a", "b"], {"k": 1}, True, [], [1, 2, 3]]
_EXTREME_TIME = ["9.3e18", "-1", "-5", "10000000000000000000", str(2 ** 63), "1e400", "NaN",
                 "Infinity", "-Infinity", "5000000000000", "4200000000", "1e308"]
_EXTREME_RATING = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "0", "5.5", "6", "1e308", "-3"]


@st.composite
def json_record(draw, i: int, eol: bytes) -> Record:
    kind = draw(st.sampled_from(JSON_KINDS))
    v = draw(_valid_values(i))
    d = _json_dict(v)
    rec = Record(i, kind, b"", v["user"], v["item"], v["rating_value"], v["timestamp"], v["text"])
    ascii_only = draw(st.booleans())
    dump = lambda obj: json.dumps(obj, ensure_ascii=ascii_only)  # noqa: E731
    if kind == "ok":
        line = dump(d)
    elif kind == "ok_literal":  # the 2014 "strict=False" files
        line = repr(d)
    elif kind == "ok_int_ids":
        d["reviewerID"] = rec.user = 10_000_000 + i
        rec.user = str(rec.user)
        line = dump(d)
    elif kind == "ok_bom":  # a file joined from several keeps their byte order marks
        line = "\ufeff" + dump(d)
    elif kind == "ok_long":
        d["reviewText"] = rec.text = "long " * (LONG // 5)
        line = dump(d)
    elif kind == "bad_json":
        full = dump(d)
        line = full[:draw(st.integers(1, len(full) - 1))]
    elif kind == "wrong_type":
        key = draw(st.sampled_from(["reviewText", "overall", "unixReviewTime", "reviewerID", "asin",
                                    "helpful", "summary"]))
        d[key] = draw(st.sampled_from(_WRONG if key != "helpful" else [{"k": 1}, ["a", "b"], True, [1, 2, 3]]))
        line = dump(d)
    elif kind == "extreme":  # raw number text, so 1e400 and NaN are written as such
        key = draw(st.sampled_from(["unixReviewTime", "overall"]))
        d[key] = "@@X@@"
        value = draw(st.sampled_from(_EXTREME_TIME if key == "unixReviewTime" else _EXTREME_RATING))
        line = dump(d).replace('"@@X@@"', value)
    elif kind == "missing":
        key = draw(st.sampled_from(["reviewerID", "asin", "overall", "unixReviewTime", "reviewText"]))
        if draw(st.booleans()):
            del d[key]
        else:
            d[key] = None
        line = dump(d)
    elif kind == "empty_text":
        d["reviewText"] = draw(st.sampled_from(["", "   ", "\t\n "]))
        line = dump(d)
    elif kind == "not_object":
        line = draw(st.sampled_from(["[1, 2]", '"text"', "null", "42", "true", "{1, 2}"]))
    elif kind == "deep":
        line = "[" * draw(st.integers(1_000, 100_000))
    elif kind == "surrogate":
        d["reviewText"] = "bad \ud800 half"
        line = dump(d) if draw(st.booleans()) else repr(d)
    elif kind == "long_garbage":
        line = "x" * LONG
    else:  # nul, stray: bytes put into the line
        line = dump(d)
    data = line.encode("utf-8", "surrogatepass")
    if kind == "nul":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\x00" + data[at:]
    if kind == "stray":
        data = _stray(draw, data)
        rec.kind = "unknown"
    rec.data = data + eol
    return rec


def _stray(draw, data: bytes) -> bytes:
    junk = draw(st.binary(min_size=1, max_size=6))
    at = draw(st.integers(0, len(data)))
    return data[:at] + junk + data[at:]


def _csv_line(fields: list[str], eol: bytes, quote_all: bool) -> bytes:
    buf = io.StringIO()  # with "\n" as terminator, so that a field holding one is quoted
    csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL).writerow(fields)
    return buf.getvalue()[:-1].encode("utf-8") + eol


@st.composite
def csv_record(draw, i: int, eol: bytes) -> Record:
    kind = draw(st.sampled_from(CSV_KINDS))
    v = draw(_valid_values(i))
    rec = Record(i, kind, b"", v["user"], v["item"], v["rating_value"], v["timestamp"], v["text"])
    if kind == "ok_long":
        v["text"] = rec.text = "long " * (LONG // 5)
    row = [v["user"], v["item"], "Ann", json.dumps(v["votes"]), v["text"], str(v["rating"]), "sum",
           str(v["time"]), "01 1, 2014"]
    quote_all = draw(st.booleans())
    if kind == "wrong_count":
        row = row[:-1] if draw(st.booleans()) else row + ["extra"]
    elif kind == "extreme":
        col = draw(st.sampled_from([7, 5]))
        row[col] = draw(st.sampled_from(_EXTREME_TIME if col == 7 else _EXTREME_RATING))
    elif kind == "missing":
        row[draw(st.sampled_from([0, 1, 5, 7]))] = ""
    elif kind == "empty_text":
        row[4] = draw(st.sampled_from(["", "   "]))
    data = _csv_line(row, eol, quote_all)
    if kind == "bad_utf8":  # in reviewerName, the first "Ann" of the line
        at = data.index(b"Ann") + 3
        data = data[:at] + b"\xff\xfe" + data[at:]
    if kind == "unclosed_quote":  # the text field opens a quote that never closes
        rest = row[4].replace('"', "").replace("\n", " ") + "," + ",".join(row[5:])
        data = _csv_line(row[:4], b"", quote_all) + b',"' + rest.encode() + eol
        rec.breaks_quotes = True
    if kind == "stray_quote":
        at = draw(st.integers(0, len(data) - len(eol)))
        data = data[:at] + b'"' + data[at:]
        rec.kind, rec.breaks_quotes = "unknown", True
    if kind == "stray":
        body = _stray(draw, data[:len(data) - len(eol)])
        data = body + eol
        rec.kind, rec.breaks_quotes = "unknown", b'"' in body or b"\r" in body
    if kind == "nul":
        at = draw(st.integers(0, len(data) - len(eol)))
        data = data[:at] + b"\x00" + data[at:]
        rec.kind = "unknown"  # a NUL inside a quoted text is a (strange) valid value
    rec.data = data
    return rec


@st.composite
def fuzz_files(draw, layout: str | None = None) -> FuzzFile:
    """A review file of up to a dozen records, each valid or broken, with file-level damage."""
    layout = layout or draw(st.sampled_from(["json", "csv"]))
    crlf = draw(st.booleans())
    eol = b"\r\n" if crlf else b"\n"
    make = json_record if layout == "json" else csv_record
    records = []
    for i in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 9)) == 0:
            records.append(Record(-1, "blank", draw(st.sampled_from([b"\n", b"\r\n", b"  \n"]))))
        records.append(draw(make(i, eol)))
    ff = FuzzFile(layout, records, bom=draw(st.booleans()), crlf=crlf, gz=draw(st.booleans()),
                  chunk_bytes=draw(st.sampled_from([48, 160, 1 << 20])))
    if ff.gz and draw(st.booleans()):
        ff.cut = draw(st.floats(0.0, 0.999))
    if draw(st.integers(0, 4)) == 0:
        ff.tail = b"\x00" + draw(st.one_of(st.binary(min_size=1, max_size=300), st.just(PNG)))
    content = bytearray(BOM if ff.bom else b"")
    for r in records:
        ff.offsets.append(len(content))
        content += r.data
        ff.ends.append(len(content))
    if records and not ff.tail and draw(st.booleans()):  # no line end after the last record
        end = eol if records[-1].data.endswith(eol) else b"\n" if records[-1].data.endswith(b"\n") else b""
        if end:
            content = content[:len(content) - len(end)]
            ff.ends[-1] = -1  # its line end is missing
    content += ff.tail
    ff.content = bytes(content)
    ff.data = gzip.compress(ff.content, mtime=0) if ff.gz else ff.content
    if ff.cut is not None:  # at least the 2 magic bytes: still a gzip file, cut short
        ff.data = ff.data[:min(len(ff.data) - 1, max(2, int(len(ff.data) * ff.cut)))]
    return ff


# -- the check -----------------------------------------------------------------------


@dataclass
class Outcome:
    """What one file gave: rows in, reviews, error rows, the valid records that came out
    whole, and the properties broken (empty when the file passed)."""

    rows_in: int = 0
    reviews: int = 0
    errors: int = 0
    valid_expected: int = 0
    valid_found: int = 0
    problems: list[str] = field(default_factory=list)


def _readable(ff: FuzzFile) -> bytes:
    """The content a reader can get back from the file's bytes: all of it, or what a cut
    gzip stream yields (zlib, independently of the code under test)."""
    if ff.cut is None:
        return ff.content
    if len(ff.data) < 2:
        return b""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(ff.data)
    except zlib.error:
        return b""


def _clean_text(data: bytes) -> bool:
    """UTF-8 without NUL or control bytes: no reader may call it binary."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t\n\r\x0b\x0c" or c == "\x7f" for c in text)


def check(ff: FuzzFile, folder: Path) -> Outcome:
    """Ingest `ff` with the pure functions and return the properties it broke.

    Properties (each falsifiable, none asks the parser what the input was):
    1. nothing escapes: no exception from detect_layout (explicit format), plan_file,
       parse_chunk or normalise (the caller sees it raise);
    2. conservation: rows in (the parser's count) = reviews + error rows, per file;
    3. every error row names its source (the file), a line >= 1, a type and a message;
    4. no good row lost: every record written whole and valid comes out as a review
       with the user, item, rating, timestamp, text and line written, unless it lies
       after the point where the file was damaged: the end of what a cut gzip stream
       yields, or (CSV) a record whose stray or unclosed quote may change how the
       records after it are read (a newline inside quotes is legal CSV);
    5. nothing invented: no review comes from a record written broken;
    6. JSON lines with no damage (whole, no control bytes): rows in = the non-blank
       lines written (an independent count), and no "reading stopped" row; a cut
       gzip file gives exactly one "reading stopped" row;
    7. auto-detection either finds the layout the explicit format gives or raises a
       ValueError naming the file, and it must find it when the first record is valid
       and the file is clean UTF-8 text read whole.
    """
    import pyarrow as pa

    from rexeval.pipelines.ingest.chunks import number_chunks, plan_file
    from rexeval.pipelines.ingest.formats import detect_layout
    from rexeval.pipelines.ingest.parse import parse_chunk
    from rexeval.pipelines.ingest.validate import normalise

    path = folder / ff.name
    path.write_bytes(ff.data)
    out = Outcome()
    layout = detect_layout(path, FORMATS[ff.layout])
    reviews, errors = [], []
    for chunk in number_chunks([plan_file(path, layout, ff.chunk_bytes)]):
        parsed = parse_chunk(chunk)
        r, e = normalise(parsed)
        out.rows_in += parsed.records
        reviews.append(r)
        errors.append(e)
    rv = pa.concat_tables(reviews).to_pylist() if reviews else []
    er = pa.concat_tables(errors).to_pylist() if errors else []
    out.reviews, out.errors = len(rv), len(er)
    bad = out.problems.append
    # 2. conservation
    if out.rows_in != out.reviews + out.errors:
        bad(f"rows in {out.rows_in} != reviews {out.reviews} + error rows {out.errors}")
    # 3. error rows name where
    for e in er:
        if e["source"] != str(path) or e["line"] is None or e["line"] < 1 or not e["message"] or not e["error_type"]:
            bad(f"error row without source/line/message: {_short(e)}")
            break
    # 4 and 5: per record
    readable = _readable(ff)
    by_line = {r["line"]: r for r in rv}
    line_of = [1 + ff.content.count(b"\n", 0, at) for at in ff.offsets]
    spans = {}
    for rec, at, line in zip(ff.records, ff.offsets, line_of):
        for k in range(rec.data.count(b"\n") + (0 if rec.data.endswith(b"\n") else 1)):
            spans[line + k] = rec
    quotes_broken = False
    for rec, end, line in zip(ff.records, ff.ends, line_of):
        # Whole: its line end was read (a cut stream's last line is no record), or it is
        # the unterminated last line of a file read to its end.
        whole = 0 <= end <= len(readable) or (end < 0 and ff.cut is None)
        if rec.valid and whole and not quotes_broken:
            out.valid_expected += 1
            got = by_line.get(line)
            want = (rec.user, rec.item, np.float32(rec.rating), rec.timestamp, rec.text)
            if got is None:
                bad(f"valid record {rec.index} ({rec.kind}) at line {line} is not a review"
                    f"{_why(er, line)}")
            elif (got["user_id"], got["item_id"], np.float32(got["rating"]), got["timestamp"], got["text"]) != want:
                bad(f"record {rec.index} at line {line} came out as {_short(got)}, written {_short(want)}")
            else:
                out.valid_found += 1
        if ff.layout == "csv" and rec.breaks_quotes:
            quotes_broken = True
    for r in rv:
        rec = spans.get(r["line"])
        if rec is None or rec.invalid and not (ff.layout == "csv" and _after_break(ff, rec)):
            bad(f"review at line {r['line']} comes from a record written broken "
                f"({rec.kind if rec else 'no record'}): {_short(r)}")
    # 6. independent count and stop rows
    stops = [e for e in er if e["error_type"] == "read_stopped"]
    if ff.layout == "json" and ff.cut is None and _clean_text(ff.content):
        body = ff.content[len(BOM):] if ff.bom else ff.content
        lines = sum(1 for x in body.split(b"\n") if x.strip())
        if out.rows_in != lines:
            bad(f"rows in {out.rows_in} != {lines} non-blank lines written")
        if stops:
            bad(f"a whole, clean file has a 'reading stopped' row: {_short(stops[0])}")
    if ff.cut is not None and len(stops) != 1:
        bad(f"a cut gzip file gives {len(stops)} 'reading stopped' rows, not one")
    # 7. auto-detection
    _check_auto(ff, path, layout, out)
    return out


def _after_break(ff: FuzzFile, rec: Record) -> bool:
    """Whether `rec` comes at or after a CSV record whose quotes may swallow others."""
    for r in ff.records:
        if r.breaks_quotes:
            return True
        if r is rec:
            return False
    return False


def _check_auto(ff: FuzzFile, path: Path, layout, out: Outcome) -> None:
    from rexeval.pipelines.ingest.formats import detect_layout

    try:
        auto = detect_layout(path)
    except ValueError as exc:
        if not str(exc).startswith(str(path)):
            out.problems.append(f"auto-detection's message does not name the file: {exc}")
        first = next((r for r in ff.records if r.kind != "blank"), None)
        must = (first is not None and first.valid and ff.cut is None and not ff.tail
                and _clean_text(ff.content))
        if must:
            out.problems.append(f"auto-detection refused a clean file whose first record is valid: {exc}")
        return
    if auto != layout:
        out.problems.append(f"auto-detection found {auto.format} {sorted(auto.fields.items())[:3]}, "
                            f"not the {FORMATS[ff.layout]} layout")


def _why(errors: list[dict], line: int) -> str:
    e = next((e for e in errors if e["line"] == line), None)
    return f" (error row: {e['error_type']} {e['field']}: {e['message'][:120]})" if e else " (no error row either)"


def _short(x) -> str:
    text = repr(x)
    return text if len(text) < 300 else text[:300] + "..."

