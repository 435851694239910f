"""Clustering on real data: the shared Musical Instruments reviews, end to end.

ingest -> STAR extraction (candidates + verification) of the first N reviews with the
profile's LLM -> `rexeval cluster` on the verified statements (bi-encoder only in the
local profile) and on the triplets; the EXTRA baseline on all reviews; Table 3 of the
runs. Every step is the product's own job (cached LLM calls, resumable outputs). Re-run:

    .venv/bin/python benchmarks/paraphrase_shared_data.py --reviews 64 [--out runs/shared-clusters]

Results go to benchmarks/results/paraphrase_shared_data.json (and the run folders).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CSV = ROOT.parent / "shared" / "data" / "amazon_musical_instruments_2014_part.csv"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reviews", type=int, default=64, help="reviews sent to the LLM (default 64)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "shared-clusters"))
    ap.add_argument("--csv", default=str(CSV))
    ap.add_argument("--extra-min-count", type=int, default=5)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "paraphrase_shared_data.json"))
    args = ap.parse_args(argv)
    from rexeval.pipelines.paraphrase.pipeline import run_cluster
    from rexeval.pipelines.paraphrase.config import ClusterConfig
    from rexeval.pipelines.paraphrase.quality import format_table3
    from rexeval.pipelines.extract.pipeline import run_extract
    from rexeval.pipelines.extract.config import ExtractConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    out = Path(args.out)
    t0 = time.time()
    run_ingest(IngestConfig(inputs=[args.csv], out=str(out / "ingest"), category="instruments"))
    run_extract(ExtractConfig(input=str(out / "ingest"), out=str(out / "star"), method="star",
                              limit=args.reviews, domain="instruments",
                              backend_options={"batch_size": 16}))
    t_extract = time.time() - t0
    runs = {"STAR": ClusterConfig(input=str(out / "star"), out=str(out / "clusters-star")),
            "EXTRA": ClusterConfig(input=str(out / "ingest"), out=str(out / "clusters-extra"), method="extra",
                                   extra_min_count=args.extra_min_count)}
    manifests = {name: run_cluster(cfg) for name, cfg in runs.items()}
    reports = [json.loads((Path(cfg.out) / "report.json").read_text()) for cfg in runs.values()]
    table = format_table3(reports[::-1], dataset="MI (shared)")
    print(table)
    result = {"reviews_extracted": args.reviews, "extract_s": round(t_extract, 1),
              "runs": {name: {"counts": m["counts"], "quality": m["quality"], "pair_filter": m["pair_filter"],
                              "timings": m["timings"]} for name, m in manifests.items()},
              "table3": table}
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
