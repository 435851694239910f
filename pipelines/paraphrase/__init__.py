"""Paraphrase clustering of statements (seed 002, section 4.2 and appendix B.3): embeddings
on Ray, FAISS nearest neighbours per polarity, an optional cross-encoder filter, connected
components refined by Algorithm 1, cluster quality (Table 3), and the EXTRA baseline
(recurring review sentences grouped by MinHash LSH)."""
