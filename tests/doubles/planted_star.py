"""Synthetic STAR benchmarks with a planted signal (test data, not a product path).

Every user has a private "voice": a few statements they use in most of their reviews.
Items have their own pools of statements that their reviewers draw from. A ranker that
learns users' habits (USERPOP, a trained model) must beat RANDOM at item level.
"""
from __future__ import annotations

import numpy as np

from rexeval.pipelines.star.data import StarData


def planted_star(n_users: int = 60, n_items: int = 30, per_user: int = 8, voice: int = 3,
                 item_pool: int = 6, seed: int = 0) -> StarData:
    rng = np.random.default_rng(seed)
    n_voice = n_users * voice
    n_statements = n_voice + n_items * item_pool
    users, items, split, trip = [], [], [], []
    for u in range(n_users):
        own = np.arange(u * voice, (u + 1) * voice)
        chosen = rng.choice(n_items, per_user, replace=False)
        for j, i in enumerate(chosen):
            r = len(users)
            users.append(u)
            items.append(i)
            split.append(2 if j == per_user - 1 else 1 if j == per_user - 2 else 0)
            pool = n_voice + i * item_pool + np.arange(item_pool)
            stm = set(rng.choice(own, 2, replace=False).tolist())
            stm.add(int(rng.choice(pool)))
            trip += [(r, s) for s in sorted(stm)]
    # An item's candidates (S_i) hold the voices of all its reviewers plus its pool, so
    # item level is far from trivial for a ranker that ignores the user.
    return StarData.from_arrays(users, items, split, np.array(trip), n_users, n_items, n_statements)
