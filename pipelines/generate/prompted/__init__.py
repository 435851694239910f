"""Seed 004's prompted explanation generators (user-based, item-based, review extraction,
review summarisation, PreferenceLogic): ALERT's leaderboard methods that need no trained
text model, each built from the ratings and reviews of a split and, where the method
says so, a prompted LLM; the user- and item-based ones find their similar users and
items with a BiasedMF trained by `mf.py`."""
