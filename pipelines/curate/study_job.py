"""The study job `alert_curate`: seed 004's dataset (section 3.1) from ingested Amazon
Reviews 2023 purchases, before the generators:

    steps:
      curate:   {job: alert_curate, with: {input: "{ingest}"}}
      generate: {job: generate_llm, with: {input: "{curate}", ...}}

The rules and our readings of what the paper leaves open are in `rules.py`; the Ray
wiring (the driver holds counts and per-category sample cuts, never the table) in
`pipeline.py`. Found by the study's discovery of `pipelines/<capability>/study_job.py`.
"""
from __future__ import annotations

from rexeval.pipelines.core.study_registry import register_study_job
from rexeval.pipelines.curate.config import CURATE_OUTPUTS, CurateConfig


@register_study_job("alert_curate", CurateConfig, outputs=CURATE_OUTPUTS,
                    description="seed 004 §3.1: 5-star purchases of titled items, users with 5-20, "
                                "at most 200 users per category (seeded)")
def run_alert_curate(cfg: CurateConfig, progress=print) -> dict:
    from rexeval.pipelines.curate.pipeline import run_curate

    return run_curate(cfg, progress=progress)
