"""The STAR statement-ranking benchmark (seed 002, sections 4.3 and 5): interactions and
their statement sets, the leave-last-two split, popularity baselines, BPER+ and ExpGCN
trained on Ray Tune, batched P/R/NDCG/hit@k at global, item and user level, and Table 1
with significance tests."""
