"""LLM judges of explanations: seed 001's Likert judge (four aspects, zero/one/personalised
shots, ensembles), seed 004's ALERT pairwise judge (both orders, divide-and-aggregate) and
its reward-model variant, and seed 004's inferior-explanation detection test; the
recommendation contexts they read, and the chunked, resumable judge jobs on Ray."""
