"""`rexeval evaluate`: seed 000's suite over any system's explanations. Explanations and
references become examples; metric families (statement-level NLI and St2Exp, SummaC,
AlignScore, QuestEval, BERTScore, STS, BARTScore, BLEURT, n-gram and feature metrics)
run on Ray Data with NLI through the Serve deployment; Tables III-VI and aggregates."""
