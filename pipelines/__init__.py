"""The capabilities of rexeval, one package each, wired onto Ray.

core/           the stage contract, the Ray runtime, table schemas, sharded resumable
                outputs and what every job shares (below every other package here)
ingest/         review files -> validated review tables, k-core and splits, statistics
extract/        reviews -> statements with an LLM (seeds 000, 002), extraction quality,
                rule-based ground-truth explanations (seed 000)
cluster/        paraphrase clustering of statements and the EXTRA baseline (seed 002)
star/           the STAR statement-ranking benchmark: build, baselines, training, report
evaluate/       seed 000's metric suite over explanations (NLI through Ray Serve)
judge/          LLM judges: Likert (seed 001), pairwise and detection (seed 004)
expscore/       ExpScore, the learned factor metric (seed 003)
meta_evaluate/  agreement of any evaluator with human ratings (seeds 001, 004)
sample/         the small review sample the demo runs on (data, written for rexeval)
"""
