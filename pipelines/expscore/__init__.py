"""ExpScore (seed 003): the nine explanation factors, heads trained on human ratings
(linear, multinomial logistic, a small network), their agreement with the ratings, and
scoring new explanations with a trained model."""
