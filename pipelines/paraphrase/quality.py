"""Quality of a statement clustering (seed 002, Table 3): size, reduction, SSE and SSB.

Table 3 reports per method the number of clusters, the reduction in statements, SSE
(intra-cluster dispersion, lower is better) and SSB (inter-cluster separation, higher is
better), citing Palacio-Niño & Berzal (2019):

    SSE = sum_k sum_{x in C_k} ||x - mu_k||^2      SSB = sum_k n_k ||mu_k - mu||^2

with mu_k the cluster mean and mu the global mean. The paper's values (SSE 0.0033, SSB
0.08) can only be normalised sums; we read them as per-statement means, i.e. divided by
the number N of (unique) statements clustered, so that SSE + SSB = TSS / N, the mean
squared distance to the global mean. The raw sums are reported too.

Reduction (%) is 100 * (1 - clusters / statements) over the distinct statements that
were clustered (``reduction_pct``, Table 3's Red.%): the paper's EXTRA row (<= 0.22%)
is only possible when exact repeats of a sentence are counted once. The reduction over
all statement rows (``statements_in``, repeats included) is ``reduction_pct_rows``.
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rexeval.pipelines.paraphrase.graph import _groups, _label_ranges, _rows_per_block, _segment_sums, _sum_rows
from rexeval.pipelines.paraphrase.config import CLUSTER_OUTPUTS as OUT
from rexeval.storage import Location, PathLike, location


# ----------------------------------------------------------------------------- SSE / SSB
def _sq_dev(x: np.ndarray, centre: np.ndarray) -> float:
    """sum ||x - centre||^2 with one temporary."""
    diff = np.subtract(x, centre)
    return float(np.einsum("ij,ij->", diff, diff))


def sse_ssb(emb: np.ndarray, labels: np.ndarray) -> dict:
    """SSE and SSB per statement (and as sums), float64, in label-aligned row blocks.

    Two passes over the rows: the global mean, then per block of whole clusters the cluster
    means, the squared deviations from them (SSE) and the weighted spread of the means
    around the global mean (SSB). Memory stays bounded by one block, whatever N and K.
    """
    emb = np.asarray(emb)
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    if n == 0:
        return {"sse": 0.0, "ssb": 0.0, "sse_sum": 0.0, "ssb_sum": 0.0, "tss_mean": 0.0}
    k = int(labels.max()) + 1
    order, sizes, starts = _groups(labels, k)
    rows = _rows_per_block(emb.shape[1])
    mu = sum(emb[s:s + rows].sum(axis=0, dtype=np.float64) for s in range(0, n, rows)) / n
    sse = ssb = tss = 0.0
    for lo, hi in _label_ranges(sizes, rows):
        s0, s1 = int(starts[lo]), int(starts[hi - 1] + sizes[hi - 1])
        nodes = order[s0:s1]
        cnt = sizes[lo:hi][sizes[lo:hi] > 0]
        if s1 - s0 <= rows:
            x = emb[nodes].astype(np.float64)
            means = _segment_sums(x, cnt) / cnt[:, None]
            sse += _sq_dev(x, means[np.repeat(np.arange(cnt.size), cnt)])
            tss += _sq_dev(x, mu)
        else:                                       # one cluster larger than a block
            means = (_sum_rows(emb, nodes, rows) / nodes.size)[None, :]
            for s in range(0, nodes.size, rows):
                x = emb[nodes[s:s + rows]].astype(np.float64)
                sse += _sq_dev(x, means)
                tss += _sq_dev(x, mu)
        ssb += float((cnt * ((means - mu) ** 2).sum(axis=1)).sum())
    return {"sse": sse / n, "ssb": ssb / n, "sse_sum": sse, "ssb_sum": ssb, "tss_mean": tss / n}


# ----------------------------------------------------------------------------- counts
def reduction_pct(n_statements: int, n_clusters: int) -> float:
    """100 * (1 - clusters / statements); 0.0 when there are no statements."""
    return 0.0 if n_statements <= 0 else 100.0 * (1.0 - n_clusters / n_statements)


def _cluster_sizes(labels: np.ndarray) -> np.ndarray:
    return np.bincount(np.asarray(labels, dtype=np.int64)) if len(labels) else np.zeros(0, np.int64)


def size_histogram(labels: np.ndarray) -> list[dict]:
    """Rows {size, clusters, statements} for each cluster size present, ascending."""
    sizes = _cluster_sizes(labels)
    counts = np.bincount(sizes[sizes > 0]) if (sizes > 0).any() else np.zeros(0, np.int64)
    return [{"size": int(s), "clusters": int(counts[s]), "statements": int(s * counts[s])}
            for s in np.flatnonzero(counts)]


def cluster_examples(labels: np.ndarray, representatives: np.ndarray, texts: Sequence[str],
                     n_largest: int = 5, n_random: int = 5, max_members: int = 5,
                     seed: int = 0) -> list[dict]:
    """The largest clusters, then a seeded random draw of other non-singleton clusters.

    Singletons are left out of the random draw (they show nothing about grouping) unless
    nothing else is left. Members are listed in node order, representative excluded.
    """
    labels = np.asarray(labels, dtype=np.int64)
    sizes = _cluster_sizes(labels)
    present = np.flatnonzero(sizes > 0)
    by_size = present[np.lexsort((present, -sizes[present]))]
    largest = by_size[:n_largest]
    taken = np.zeros(sizes.size, dtype=bool)
    taken[largest] = True
    rest = present[~taken[present]]
    pool = rest[sizes[rest] > 1] if (sizes[rest] > 1).any() else rest
    rng = np.random.default_rng(seed)
    drawn = np.sort(rng.choice(pool, size=min(n_random, pool.size), replace=False)) \
        if pool.size and n_random > 0 else np.zeros(0, np.int64)
    out = []
    for kind, chosen in (("largest", largest), ("random", drawn)):
        for c in chosen.tolist():
            rep = int(representatives[c])
            others = [int(v) for v in np.flatnonzero(labels == c) if v != rep][:max_members]
            out.append({"cluster": int(c), "kind": kind, "size": int(sizes[c]),
                        "representative": texts[rep], "members": [texts[v] for v in others]})
    return out


def quality_summary(method: str, emb: np.ndarray, labels: np.ndarray, representatives: np.ndarray,
                    texts: Sequence[str], n_statements_in: int | None = None) -> dict:
    """Everything Table 3 and the report need for one clustering, as plain JSON values."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = _cluster_sizes(labels)
    sizes = sizes[sizes > 0]
    n = int(labels.size)
    n_in = n if n_statements_in is None else int(n_statements_in)
    scores = sse_ssb(emb, labels)
    return {"method": method, "statements": n, "statements_in": n_in,
            "clusters": int(sizes.size), "singletons": int((sizes == 1).sum()),
            "largest": int(sizes.max()) if sizes.size else 0,
            "reduction_pct": reduction_pct(n, int(sizes.size)),
            "reduction_pct_rows": reduction_pct(n_in, int(sizes.size)),
            **scores,
            "histogram": size_histogram(labels),
            "examples": cluster_examples(labels, representatives, texts)}


# ----------------------------------------------------------------------------- report
def format_table3(rows: list[dict], dataset: str | None = None) -> str:
    """Markdown in Table 3's layout; the best (highest) SSB is in bold."""
    lines = ["| Dataset | Method | #Clust. | Red.% | SSE ↓ | SSB ↑ |",
             "|---|---|---:|---:|---:|---:|"]
    best = max((r["ssb"] for r in rows), default=None)
    for k, r in enumerate(rows):
        name = (dataset if dataset is not None else r.get("dataset", "")) if k == 0 else ""
        ssb = f"{r['ssb']:.4f}"
        if len(rows) > 1 and f"{best:.4f}" == ssb:
            ssb = f"**{ssb}**"
        lines.append(f"| {name} | {r['method']} | {r['clusters']} | {r['reduction_pct']:.2f} "
                     f"| {r['sse']:.4f} | {ssb} |")
    return "\n".join(lines) + "\n"


def _histogram_md(hist: list[dict]) -> str:
    lines = ["| Size | Clusters | Statements |", "|---:|---:|---:|"]
    lines += [f"| {h['size']} | {h['clusters']} | {h['statements']} |" for h in hist]
    return "\n".join(lines) + "\n"


def _examples_md(examples: list[dict]) -> str:
    parts = []
    for ex in examples:
        parts.append(f"- **{ex['representative']}** (cluster {ex['cluster']}, {ex['kind']}, "
                     f"size {ex['size']})")
        parts += [f"  - {m}" for m in ex["members"]]
    return "\n".join(parts) + "\n" if parts else "(no clusters)\n"


def _plot_sizes(hist: list[dict], title: str) -> bytes:
    """The cluster-size histogram as PNG bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    try:
        ax.bar([h["size"] for h in hist], [h["clusters"] for h in hist], color="#4477aa")
        if hist:
            ax.set_yscale("log")
        ax.set_xlabel("cluster size (statements)")
        ax.set_ylabel("clusters (log scale)")
        ax.set_title(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, dpi=100, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


# How the clustering was made, when the caller says (printed under the title).
_SETTINGS = (("stage", "statements"), ("embedder", "embedder"), ("pair_filter", "pair filter"),
             ("quality_embedder", "SSE/SSB embedder"))


def write_report(folder: PathLike, summary: dict) -> dict[str, Location]:
    """report.md, report.json, cluster_sizes.csv and cluster_sizes.png under ``folder``
    (a local folder or a URI)."""
    folder = location(folder)
    folder.mkdir()
    paths = {"md": folder / OUT.report_md, "json": folder / OUT.report,
             "csv": folder / OUT.sizes, "png": folder / OUT.sizes_figure}
    hist = summary.get("histogram", [])
    md = [f"# Statement clustering: {summary['method']}", "",
          (f"{summary['statements_in']} statements in, {summary['statements']} unique, "
          f"{summary['clusters']} clusters ({summary['singletons']} singletons, largest "
          f"{summary['largest']}). SSE/SSB are per-statement means (sums / N): SSE "
          f"{summary['sse_sum']:.4f} and SSB {summary['ssb_sum']:.4f} in total."), "",
          *[f"- {label}: {summary[key]}" for key, label in _SETTINGS if summary.get(key)], "",
          format_table3([summary], summary.get("dataset")), "## Cluster sizes", "",
          _histogram_md(hist), "## Examples", "", _examples_md(summary.get("examples", []))]
    paths["md"].write_text("\n".join(md), encoding="utf-8")
    paths["json"].write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["csv"].write_text(pd.DataFrame(hist, columns=["size", "clusters", "statements"]).to_csv(index=False))
    paths["png"].write_bytes(_plot_sizes(hist, f"Cluster sizes: {summary['method']}"))
    return paths
