"""Statement rankers for the STAR benchmark (seed 002 section 5.1): popularity baselines,
BPER+ and ExpGCN, behind one interface (`base.Ranker`) and one registry."""
