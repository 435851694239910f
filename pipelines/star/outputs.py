"""What the `rexeval star` jobs write in their folders (pipelines/core/outputs.py).

Its own module because `star/config.py` imports `star/evaluate.py`, which writes the
results folders: both import these declarations from here."""
from __future__ import annotations

from rexeval.pipelines.core.outputs import Output, Outputs, table_outputs

BUILD_TABLES = ("interactions", "triplets", "candidates", "errors")
STAR_BUILD_OUTPUTS = table_outputs(*BUILD_TABLES) | Outputs(
    stats=Output("stats.json", "seed 002's Table 6 numbers (before and after clustering), by benchmark name"),
    stats_md=Output("stats.md", "Table 6 as Markdown"),
)
# Every ranking job (baselines, train, evaluate): one folder per method under results/.
RESULTS = Output("results", "one folder per method", folder=True)
PER_INTERACTION = Output("results/{method}/per_interaction.parquet",
                         "one row per test interaction and level, one column per metric (`run`: the seed)")
METHOD_SUMMARY = Output("results/{method}/summary.json", "the method's means per level and its settings")
STAR_RESULTS = Outputs(results=RESULTS, per_interaction=PER_INTERACTION, summary=METHOD_SUMMARY)
STAR_BASELINES_OUTPUTS = STAR_RESULTS | Outputs(
    report=Output("baselines.json", "each baseline's means per level, the settings and their hash"),
)
STAR_TRAIN_OUTPUTS = STAR_RESULTS | Outputs(
    report=Output("train-{name}.json", "the best trial and epoch, every trial, the test means, the settings"),
    sensitivity=Output("sensitivity-{name}.png", "seed 002's Figure 3 style plot (`sweep`)"),
    sensitivity_csv=Output("sensitivity-{name}.csv", "its numbers"),
    tune=Output("tune", "the Ray Tune experiment (checkpoints)", folder=True),
    work=Output("_work", "BPER+'s statement features", folder=True),
)
