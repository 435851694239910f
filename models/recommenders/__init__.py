"""Statement rankers for the STAR benchmark (seed 002 section 5.1): popularity baselines,
BPER+ and ExpGCN, behind one interface (`base.Ranker`) and one registry."""

SCAN = ("rexeval.models.recommenders", "@register_ranker")
"""Where the rankers' registry finds its modules, and `--help` their names (read, not imported)."""
