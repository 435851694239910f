"""`rexeval meta-evaluate`: how well any judge or metric agrees with human ratings, as
correlations at dataset, user and pair level (seed 001, Table 1) or, for preferences,
accuracy, Cohen's kappa and Krippendorff's alpha with and without ties (seed 004, Table 2)."""
