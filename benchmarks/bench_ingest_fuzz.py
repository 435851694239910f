"""Ingest against thousands of malformed review files: does anything escape or get lost?

The files come from the strategies that tests/pipelines/ingest/test_fuzz.py uses
(tests/doubles/review_fuzz.py): JSON lines and CSV built from records we wrote, valid
or broken in known ways, with byte order marks, CRLF, blank lines, cut gzip streams,
binary tails and small parse tasks. Each goes through the pure ingest functions
(detect_layout -> plan_file -> parse_chunk -> normalise) and `review_fuzz.check`,
whose properties are: no exception; rows in = reviews + error rows; every error row
names its file, a line >= 1 and a message; every record written whole and valid comes
out as a review with its values and line; no review from a broken record; auto
detection agrees with the explicit format or refuses naming the file.

Records the number of files generated, how many passed every property ("nothing
lost"), rows in / reviews / error rows in all, and the first failures with the file
that caused each, in benchmarks/results/ingest_fuzz.json.

    python benchmarks/bench_ingest_fuzz.py --files 3000
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.doubles.review_fuzz import check, fuzz_files  # noqa: E402


def run(files: int, at_seed: int) -> dict:
    """Generate `files` files (half JSON lines, half CSV) and check each."""
    tally = collections.Counter()
    failures: list[dict] = []
    folder = Path(tempfile.mkdtemp(prefix="rexeval-fuzz-bench-"))

    def one(ff) -> None:
        tally["files"] += 1
        tally[f"files_{ff.layout}"] += 1
        try:
            out = check(ff, folder)
        except Exception as exc:  # noqa: BLE001 - an escaped exception is what we count
            problems = [f"exception: {type(exc).__name__}: {exc}",
                        traceback.format_exc(limit=-3).strip().splitlines()[-3:]]
            out = None
        else:
            problems = out.problems
            for key in ("rows_in", "reviews", "errors", "valid_expected", "valid_found"):
                tally[key] += getattr(out, key)
        if problems:
            tally["files_failed"] += 1
            if len(failures) < 20:
                failures.append({"file": ff.describe(), "problems": problems[:5]})
        else:
            tally["nothing_lost"] += 1

    settings_ = settings(max_examples=files // 2, deadline=None, database=None, phases=[Phase.generate],
                         suppress_health_check=list(HealthCheck))
    for layout in ("json", "csv"):
        test = seed(at_seed)(settings_(given(fuzz_files(layout))(one)))
        test()
    return {**dict(tally), "failures": failures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=3000, help="files to generate (half JSON, half CSV)")
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--json-out", default=str(REPO / "benchmarks" / "results" / "ingest_fuzz.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    tally = run(args.files, args.seed)
    result = {"files": tally.get("files", 0), "nothing_lost": tally.get("nothing_lost", 0),
              "files_failed": tally.get("files_failed", 0),
              "by_layout": {k: tally.get(f"files_{k}", 0) for k in ("json", "csv")},
              "rows_in": tally.get("rows_in", 0), "reviews": tally.get("reviews", 0),
              "error_rows": tally.get("errors", 0), "valid_records_expected": tally.get("valid_expected", 0),
              "valid_records_found": tally.get("valid_found", 0),
              "seconds": round(time.perf_counter() - t0, 1), "seed": args.seed, "cpus": os.cpu_count(),
              "hypothesis": hypothesis.__version__, "failures": tally["failures"]}
    print(f"{result['files']} files ({result['by_layout']}): {result['nothing_lost']} with nothing lost, "
          f"{result['files_failed']} failed; rows in {result['rows_in']:,} = reviews {result['reviews']:,} "
          f"+ error rows {result['error_rows']:,}; valid records {result['valid_records_found']:,}"
          f"/{result['valid_records_expected']:,} out; {result['seconds']} s")
    for f in result["failures"][:5]:
        print(" ", f["file"], "\n   ", "\n    ".join(map(str, f["problems"])))
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {args.json_out}")


if __name__ == "__main__":
    main()
