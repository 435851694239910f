"""Explanation generators (seed 000, section on baselines): prepare a split and its targets
(ground-truth explanations or review texts) for training, train NRT, Att2Seq, PETER and
CER with the one Tune trainer, and decode a split on a Ray Data actor pool into the
explanations table `rexeval evaluate` and `rexeval judge` read."""
