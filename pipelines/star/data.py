"""A built STAR benchmark in index space: what rankers train on and the evaluator reads.

`rexeval star build` writes three tables (interactions, triplets, candidates; schemas in
`pipelines.star.build`); `StarData.load` turns them into NumPy arrays and CSR maps:
interaction -> its statements (the ground truth S_ui), item -> statements (S_i, the
item-level candidates) and user -> statements (S_u, user level). S_i and S_u are taken
over all splits, so a test interaction's ground truth is always among its candidates
(seed 002 section 3.2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from rexeval.models.recommenders.base import TrainGraph
from rexeval.pipelines.core.io import read_parquet, table_files
from rexeval.storage import Location, location
from rexeval.pipelines.star.build import BUILD_TABLES, SPLIT_CODES

LEVELS = ("global", "item", "user")


def csr(keys: np.ndarray, values: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sorted values per key as (offsets [n_keys + 1], values)."""
    if len(keys):
        pairs = np.unique(np.stack([keys, values]).astype(np.int64), axis=1)
        keys, values = pairs[0], pairs[1]
    offsets = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n_keys), out=offsets[1:])
    return offsets, values.astype(np.int64)


def _read(root: Location, name: str):
    files = table_files(root / name) if (root / name).is_dir() else []
    if not files:
        raise FileNotFoundError(f"{root}: no {name}/ table; is this an `rexeval star build` folder?")
    t = pa.concat_tables([read_parquet(f) for f in files])
    missing = [f.name for f in BUILD_TABLES[name] if f.name not in t.column_names]
    if missing:
        raise ValueError(f"{root / name}: missing column(s) {missing}")
    return t


@dataclass
class StarData:
    """Arrays of one benchmark (index space); see the module docstring."""

    n_users: int
    n_items: int
    n_statements: int
    inter_user: np.ndarray  # [I] int64
    inter_item: np.ndarray  # [I] int64
    inter_split: np.ndarray  # [I] int8: 0 train, 1 valid, 2 test
    inter_ids: np.ndarray  # [I] object: review_id
    pos_offsets: np.ndarray  # [I + 1] int64: ground truth CSR
    pos_values: np.ndarray  # [nnz] int64
    statement_texts: np.ndarray  # [S] object
    statement_ids: np.ndarray  # [S] object: cluster_id
    user_ids: np.ndarray  # [U] object
    item_ids: np.ndarray  # [N] object
    _candidates: dict = field(default_factory=dict, repr=False, compare=False)  # level -> CSR

    @classmethod
    def from_arrays(cls, inter_user, inter_item, inter_split, triplets: np.ndarray,
                    n_users: int | None = None, n_items: int | None = None,
                    n_statements: int | None = None, statement_texts=None) -> StarData:
        """Build from plain arrays (tests, benchmarks): triplets are (interaction, statement)."""
        inter_user = np.asarray(inter_user, dtype=np.int64)
        inter_item = np.asarray(inter_item, dtype=np.int64)
        trip = np.asarray(triplets, dtype=np.int64).reshape(-1, 2)
        n_users = int(inter_user.max()) + 1 if n_users is None else n_users
        n_items = int(inter_item.max()) + 1 if n_items is None else n_items
        n_statements = int(trip[:, 1].max()) + 1 if n_statements is None else n_statements
        offsets, values = csr(trip[:, 0], trip[:, 1], len(inter_user))
        texts = (np.array([f"statement {s}" for s in range(n_statements)], dtype=object)
                 if statement_texts is None else np.asarray(statement_texts, dtype=object))
        return cls(n_users, n_items, n_statements, inter_user, inter_item,
                   np.asarray(inter_split, dtype=np.int8),
                   np.array([str(i) for i in range(len(inter_user))], dtype=object),
                   offsets, values, texts, np.array([str(s) for s in range(n_statements)], dtype=object),
                   np.array([str(u) for u in range(n_users)], dtype=object),
                   np.array([str(i) for i in range(n_items)], dtype=object))

    @classmethod
    def load(cls, path: str | Path | Location) -> StarData:
        root = location(path)
        inter = _read(root, "interactions").sort_by("interaction")
        trip = _read(root, "triplets")
        cand = _read(root, "candidates").sort_by("statement")
        n_inter = inter.num_rows
        if not np.array_equal(inter.column("interaction").to_numpy(), np.arange(n_inter)):
            raise ValueError(f"{root / 'interactions'}: interaction indices are not 0..{n_inter - 1}")
        users = inter.column("user").to_numpy()
        items = inter.column("item").to_numpy()
        user_ids = np.empty(int(users.max()) + 1 if n_inter else 0, dtype=object)
        user_ids[users] = inter.column("user_id").to_numpy(zero_copy_only=False)
        item_ids = np.empty(int(items.max()) + 1 if n_inter else 0, dtype=object)
        item_ids[items] = inter.column("item_id").to_numpy(zero_copy_only=False)
        split_names = inter.column("split").to_numpy(zero_copy_only=False)
        unknown = set(np.unique(split_names)) - set(SPLIT_CODES)
        if unknown:
            raise ValueError(f"{root / 'interactions'}: unknown split name(s) {sorted(unknown)}")
        split = np.vectorize(SPLIT_CODES.__getitem__, otypes=[np.int8])(split_names) if n_inter else \
            np.zeros(0, np.int8)
        offsets, values = csr(trip.column("interaction").to_numpy(), trip.column("statement").to_numpy(),
                              n_inter)
        return cls(len(user_ids), len(item_ids), cand.num_rows, users.astype(np.int64),
                   items.astype(np.int64), split, inter.column("review_id").to_numpy(zero_copy_only=False),
                   offsets, values, cand.column("text").to_numpy(zero_copy_only=False),
                   cand.column("cluster_id").to_numpy(zero_copy_only=False), user_ids, item_ids)

    def save(self, path: str | Path | Location) -> Location:
        """Write the three build tables (the format `rexeval star build` writes), so data
        made in memory (tests, benchmarks) can go through the jobs and Ray Tune."""
        from rexeval.pipelines.core.io import write_parquet_atomic
        from rexeval.pipelines.star.build import CANDIDATES, INTERACTIONS, TRIPLETS

        root = location(path)
        names = {v: k for k, v in SPLIT_CODES.items()}
        n = self.n_interactions
        inter = pa.table({
            "interaction": np.arange(n, dtype=np.int64), "review_id": self.inter_ids.astype(str),
            "user_id": self.user_ids[self.inter_user].astype(str),
            "item_id": self.item_ids[self.inter_item].astype(str), "timestamp": np.zeros(n, np.int64),
            "split": [names[int(c)] for c in self.inter_split], "user": self.inter_user, "item": self.inter_item,
        }, schema=INTERACTIONS)
        every = self.triplet_arrays(np.arange(n))
        lengths = np.diff(self.pos_offsets)
        trip = pa.table({"interaction": np.repeat(np.arange(n, dtype=np.int64), lengths),
                         "user": every[:, 0], "item": every[:, 1], "statement": every[:, 2]}, schema=TRIPLETS)
        cand = pa.table({"statement": np.arange(self.n_statements, dtype=np.int64),
                         "cluster_id": self.statement_ids.astype(str), "text": self.statement_texts.astype(str),
                         "sentiment": pa.nulls(self.n_statements, pa.string()),
                         "rows": np.bincount(self.pos_values, minlength=self.n_statements).astype(np.int64)},
                        schema=CANDIDATES)
        for name, table in (("interactions", inter), ("triplets", trip), ("candidates", cand)):
            write_parquet_atomic(root / name / "part-00000.parquet", table)
        return root

    # -- views ----------------------------------------------------------------------

    @property
    def n_interactions(self) -> int:
        return len(self.inter_user)

    def rows(self, split: str) -> np.ndarray:
        """Interaction indices of one split."""
        return np.flatnonzero(self.inter_split == SPLIT_CODES[split])

    def triplet_arrays(self, rows: np.ndarray | None = None) -> np.ndarray:
        """[T, 3] (user, item, statement) of the given interactions (default: train)."""
        rows = self.rows("train") if rows is None else rows
        lengths = self.pos_offsets[rows + 1] - self.pos_offsets[rows]
        inter = np.repeat(rows, lengths)
        starts = np.repeat(self.pos_offsets[rows], lengths)
        within = np.arange(len(inter)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        stmts = self.pos_values[starts + within]
        return np.stack([self.inter_user[inter], self.inter_item[inter], stmts], axis=1)

    def train_graph(self) -> TrainGraph:
        return TrainGraph.from_triplets(self.n_users, self.n_items, self.n_statements,
                                        self.triplet_arrays())

    def candidates(self, level: str) -> tuple[np.ndarray, np.ndarray] | None:
        """CSR of candidate statements per item (item level) or user (user level), over all
        splits; None at global level (every statement is a candidate)."""
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")
        if level == "global":
            return None
        if level not in self._candidates:  # built once: evaluation asks every epoch
            every = self.triplet_arrays(np.arange(self.n_interactions))
            self._candidates[level] = (csr(every[:, 1], every[:, 2], self.n_items) if level == "item"
                                       else csr(every[:, 0], every[:, 2], self.n_users))
        return self._candidates[level]
