"""The study job `metric_table`: an `evaluate` run's per-example scores as one row per
explanation, for `meta_evaluate` to compare with people's ratings.

Seed 001's Table 1 asks how well reference-based metrics (BLEU, ROUGE against the user's
own explanation) agree with the users' ratings of each aspect. `evaluate` writes one row
per (example, system, metric); `meta_evaluate` reads a wide table whose columns
`<evaluator>_<aspect>` meet `human_<aspect>`. A metric scores the text once, whatever the
aspect, so its value is repeated under each aspect asked for:

    steps:
      references: {job: evaluate, with: {explanations: [...], metrics: [sentence-bleu-1, rouge-l-f]}}
      reference_table: {job: metric_table, with: {run: "{references}", aspects: [persuasiveness, accuracy]}}
      table1: {job: meta_evaluate, with: {scores: "{reference_table}/metric_scores.parquet", human: ratings.csv,
                                          judge_prefixes: [sentence-bleu-1_, rouge-l-f_]}}

Rows keep `example_id`, `system`, `user_id` and `item_id` from the run's examples, so the
meta-evaluation can join on them and group by user and pair. A metric the run did not
compute is refused, naming the ones it did.
"""
from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath
from rexeval.pipelines.core.study_registry import register_study_job, write_manifest

OUTPUTS = Outputs(
    scores=Output("metric_scores.parquet", "one row per explanation: ids and a <metric>_<aspect> column each"),
    manifest=MANIFEST_OUTPUT,
)
KEYS = ["example_id", "system"]


class MetricTableConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run: ReadPath = Field(description="an `evaluate` output folder (examples.parquet, scores.parquet)")
    out: str
    aspects: list[str] = Field(min_length=1, description="the human rating columns' aspects (human_<aspect>)")
    metrics: list[str] = Field(default_factory=list, description="the metrics kept (default: every per-example one)")


def metric_table(examples, scores, aspects: list[str], metrics: list[str]):
    """The wide table (pandas in, pandas out): one row per example of `examples`, with its
    ids and `<metric>_<aspect>` = the metric's value for every metric and aspect."""
    import pandas as pd

    present = list(dict.fromkeys(scores["metric"]))
    absent = [m for m in metrics if m not in present]
    if absent:
        raise ValueError(f"metric(s) {absent} are not in the evaluate run; it scored {present}")
    keep = metrics or present
    wide = scores[scores["metric"].isin(keep)].pivot_table(index=KEYS, columns="metric", values="value",
                                                           aggfunc="first", dropna=False)
    ids = examples[KEYS + ["user_id", "item_id"]].drop_duplicates(KEYS).reset_index(drop=True)
    values = ids[KEYS].merge(wide.reset_index(), on=KEYS, how="left").reindex(columns=KEYS + keep)
    columns = {f"{m}_{a}": values[m].to_numpy(dtype=float) for m in keep for a in aspects}
    return pd.concat([ids, pd.DataFrame(columns)], axis=1)


@register_study_job("metric_table", MetricTableConfig, outputs=OUTPUTS,
                    description="an evaluate run's per-example scores as <metric>_<aspect> columns (seed 001 Table 1)")
def run_metric_table(cfg: MetricTableConfig, progress: Callable[[str], None] = print) -> dict:
    import pyarrow as pa

    from rexeval.pipelines.core.io import read_parquet, write_parquet_atomic
    from rexeval.storage import location
    from rexeval.pipelines.evaluate.config import EVALUATE_OUTPUTS

    run = location(cfg.run)
    examples = read_parquet(run / EVALUATE_OUTPUTS.examples).to_pandas()
    scores = read_parquet(run / EVALUATE_OUTPUTS.scores).to_pandas()
    table = metric_table(examples, scores, cfg.aspects, cfg.metrics)
    write_parquet_atomic(location(cfg.out) / OUTPUTS.scores, pa.Table.from_pandas(table, preserve_index=False))
    metrics = cfg.metrics or list(dict.fromkeys(scores["metric"]))
    progress(f"metric table: {len(table):,} explanation(s), {len(metrics)} metric(s) x {len(cfg.aspects)} aspect(s)")
    return write_manifest(cfg, "metric_table", {"explanations": len(table), "metrics": len(metrics)})
