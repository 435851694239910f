"""How well does `rexeval cluster` recover known paraphrase families? (pairwise P/R, ARI)

Synthetic product statements in families with known truth
(`synthetic_paraphrases.paraphrase_families`) go through the real job on a local Ray:
the local profile's embedder (all-MiniLM-L6-v2), FAISS neighbours, bi-encoder-only pair
filter (no cross-encoder ships offline), graph refinement. Reported for the paper's
tau_pair (0.90) and lower thresholds, and for the EXTRA baseline (MinHash-LSH) on the
same statements. Re-run:

    .venv/bin/python benchmarks/eval_paraphrase_clustering.py [--families 80 --members 6]

Results go to benchmarks/results/paraphrase_families.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def statements_table(rows: list[dict]) -> pa.Table:
    from rexeval.pipelines.core.schema import STATEMENTS

    full = [{"review_id": f"r{i}", "user_id": "u", "item_id": "i", "stage": "verified", "topic": None,
             "provenance": None, **{k: r[k] for k in ("statement_id", "statement", "sentiment")}}
            for i, r in enumerate(rows)]
    return pa.Table.from_pylist(full, schema=STATEMENTS)


def evaluate(rows: list[dict], work: Path, settings: list[dict], progress=lambda m: None) -> list[dict]:
    """Run the cluster job per setting; score its labels against the families."""
    from benchmarks.synthetic_paraphrases import pairwise_scores
    from rexeval.pipelines.paraphrase.pipeline import run_cluster
    from rexeval.pipelines.paraphrase.config import ClusterConfig
    from rexeval.pipelines.core.io import read_table

    src = work / "statements.parquet"
    pq.write_table(statements_table(rows), src)
    truth_by_id = {r["statement_id"]: r["family"] for r in rows}
    results = []
    for i, s in enumerate(settings):
        out = work / f"run-{i}"
        manifest = run_cluster(ClusterConfig(input=str(src), out=str(out), **s), overwrite=True,
                               progress=progress)
        clusters = read_table(out / "clusters", "clusters").to_pylist()
        ids = sorted(truth_by_id)
        label_of = {r["statement_id"]: r["cluster_id"] for r in clusters}
        names = {c: k for k, c in enumerate(sorted(set(label_of.values())))}
        truth = np.array([truth_by_id[x] for x in ids])
        labels = np.array([names[label_of[x]] for x in ids])
        scores = pairwise_scores(truth, labels)
        results.append({"setting": s, "clusters": manifest["counts"]["clusters"],
                        "families": int(len(set(truth.tolist()))), "statements": len(ids),
                        "reduction_pct": manifest["quality"]["reduction_pct"],
                        "sse": manifest["quality"]["sse"], "ssb": manifest["quality"]["ssb"], **scores})
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", type=int, default=80)
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "paraphrase_families.json"))
    args = ap.parse_args(argv)
    from benchmarks.synthetic_paraphrases import paraphrase_families
    from rexeval.pipelines.core.runtime import init_ray

    init_ray()
    rows = paraphrase_families(args.families, args.members, seed=args.seed)
    settings = [{"tau_pair": t} for t in (0.90, 0.85, 0.80, 0.75)] + [
        {"method": "extra", "extra_threshold": 0.9}, {"method": "extra", "extra_threshold": 0.5}]
    with tempfile.TemporaryDirectory() as tmp:
        results = evaluate(rows, Path(tmp), settings)
    print(f"{len(rows)} statements in {args.families} families (local embedder all-MiniLM-L6-v2, "
          "bi-encoder only)")
    print(f"{'setting':<34} {'clusters':>8} {'pair P':>7} {'pair R':>7} {'ARI':>6} {'red.%':>6}")
    for r in results:
        name = ", ".join(f"{k}={v}" for k, v in r["setting"].items())
        print(f"{name:<34} {r['clusters']:>8} {r['pair_precision']:>7.3f} {r['pair_recall']:>7.3f} "
              f"{r['ari']:>6.3f} {r['reduction_pct']:>6.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"families": args.families, "members": args.members,
                                          "seed": args.seed, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
