"""studies/seed000.yaml names what exists: each category's topic table (the extraction and
evaluate steps fail on an unknown domain only once the study reaches them, hours in) and
a step for Table II's Statements rows (`statement_stats` over the triplets)."""
from __future__ import annotations

from pathlib import Path

from rexeval.pipelines.study.config import load_study
from rexeval.prompts import list_domains

STUDY = Path(__file__).resolve().parents[3] / "studies" / "seed000.yaml"


def test_every_category_names_a_topic_table_that_exists():
    study = load_study(STUDY)
    domains = {name: ds.vars["domain"] for name, ds in study.datasets.items()}
    assert set(domains) == {"toys", "clothes", "beauty", "sports", "cellphones"}
    assert {n: d for n, d in domains.items() if d not in list_domains()} == {}


def test_table_ii_counts_the_statements_of_the_triplets_step():
    step = load_study(STUDY).steps["table2"]
    assert step.job == "statement_stats"
    assert (step.with_["statements"], step.with_["input"]) == ("{triplets}", "{split}")
