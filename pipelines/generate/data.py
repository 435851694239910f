"""A split and its targets, turned once into the arrays the generators train and decode on.

`prepare` reads the `rexeval split` output (train/valid/test reviews) and the target of
every review: its ground-truth explanation (`--target explanation`, joined by review id
on a `rexeval ground-truth` output, seed 000 Tables III-VI) or its own text
(`--target review`, Table VII). It builds the word vocabulary from the training targets
(the `vocab_size` most frequent words), indexes every user and item of the three splits
(as the original implementations do: a user seen only in test keeps an untrained
embedding), cuts targets to `max_words`, and writes `<out>/data/`:

- `vocab.json`, `index.json` (users, items, target, lengths, counts, settings hash);
- `<split>.npz`: user, item, rating, tokens ([N, max_words + 2], BOS .. EOS PAD ..);
- `examples-<split>.parquet`: example id (= review id), user and item ids, rating and the
  target text (the decoding job's `reference`);
- `errors.parquet`: every review without a target (no ground-truth explanation, an empty
  text), with the reason, so no review is lost silently.

The folder is written once per settings and reused by every trial and by `generate run`.
The split, the ground truth and the output may be local folders or URIs
(`rexeval/storage.py`): a Tune trial or a decoding actor on any node loads the
prepared folder from where the driver wrote it.
"""
from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from rexeval.models.generators.base import PAD, Batch
from rexeval.models.generators.lm import LMTokens
from rexeval.models.generators.vocab import Vocabulary, tokenize
from rexeval.pipelines.core.inputs import resolved_text
from rexeval.pipelines.core.io import config_hash, read_table, write_json_atomic, write_parquet_atomic
from rexeval.pipelines.core.schema import SPLIT_NAMES, error_rows
from rexeval.storage import Location, PathLike, local_copy, location

STAGE = "generate-data"
EXTRAS = "extras.npz"
"""Model-specific arrays beside the examples (XRec: collaborative embeddings, profile tokens)."""
EXPLANATION_MAX_WORDS_QUANTILE = 0.95
EXAMPLES = pa.schema([
    pa.field("example_id", pa.string(), nullable=False),
    pa.field("user_id", pa.string(), nullable=False),
    pa.field("item_id", pa.string(), nullable=False),
    pa.field("rating", pa.float32(), nullable=False),
    pa.field("reference", pa.string(), nullable=False),
])


def write_npz(loc: Location, **arrays: np.ndarray) -> None:
    """An `.npz` at `loc`, written whole (numpy writes to memory, storage puts it)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    loc.write_bytes(buf.getvalue())


def read_npz(loc: Location) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` at `loc` (a local file is read in place)."""
    with np.load(loc.local_path() if loc.is_local else io.BytesIO(loc.read_bytes())) as z:
        return {k: z[k] for k in z.files}


def _save_vocab(vocab: Vocabulary | LMTokens, loc: Location) -> None:
    """The vocabulary's own file format (it saves only to a local path), put at `loc`."""
    with tempfile.TemporaryDirectory(prefix="rexeval-vocab-") as tmp:
        vocab.save(Path(tmp) / loc.name)
        loc.write_bytes((Path(tmp) / loc.name).read_bytes())


def _targets(split_dir: Location, target: str, truth: str | None) -> tuple[dict[str, pa.Table], dict[str, str]]:
    splits = {}
    for name in SPLIT_NAMES:
        if not (split_dir / name).is_dir():
            raise FileNotFoundError(f"{split_dir} is not a `rexeval split` output: no {name}/ folder in it")
        splits[name] = read_table(split_dir / name, "reviews")
    if target == "review":
        return splits, {}
    if not truth:
        raise ValueError("--target explanation needs the ground-truth explanations: give --truth "
                         "(a `rexeval ground-truth` output folder), or use --target review")
    root = location(truth)
    if not (root / "explanations").is_dir():
        raise FileNotFoundError(f"{root} is not a `rexeval ground-truth` output (no explanations/ in it)")
    expl = read_table(root / "explanations", "explanations")
    return splits, dict(zip(expl.column("example_id").to_pylist(), expl.column("explanation").to_pylist()))


def default_max_words(texts: list[str], quantile: float = EXPLANATION_MAX_WORDS_QUANTILE,
                      length: Callable[[str], int] | None = None) -> int:
    """The fixed length for long targets: the `quantile` of training target lengths in
    words, or in LM tokens for `length` (seed 000's explanations run to several clauses;
    the originals' 15-20 words would cut most of them)."""
    length = length or (lambda t: len(tokenize(t)))
    lengths = [length(t) for t in texts]
    return max(1, int(np.ceil(np.quantile(lengths, quantile)))) if lengths else 1


def prepare(split: PathLike, out: PathLike, *, target: str, truth: str | None, vocab_size: int,
            max_words: int | None, tokenizer: str | None = None,
            progress: Callable[[str], None] = print) -> Location:
    """Write (or reuse) `<out>/data` for these settings; return its path.

    `max_words=None`: the model's original length for review targets is passed in by the
    caller; for explanation targets None means `default_max_words` of the training targets.
    `tokenizer`: a pretrained LM's folder for the models built on one (PEPLER, XRec):
    targets are that LM's tokens (`models.generators.lm.LMTokens`), lengths count them and
    `vocab_size` is not used; None: the word vocabulary of the from-scratch models.
    """
    split_dir = location(split)
    folder = location(out) / "data"
    settings = {"split": resolved_text(split), "target": target,
                "truth": resolved_text(truth) if truth else None, "vocab_size": vocab_size,
                "max_words": max_words}
    if tokenizer:
        settings["tokenizer"] = tokenizer
    else:  # word vocabularies keep case since issue 31; a lower-cased folder is not reused
        settings["case"] = "kept"
    want = config_hash(settings)
    index_path = folder / "index.json"
    if index_path.exists():
        have = index_path.read_json()
        if have.get("config_hash") == want:
            return folder
        raise FileExistsError(f"{folder} was prepared with other settings ({have.get('settings')}); "
                              "use another --out folder or --overwrite")
    splits, truth_text = _targets(split_dir, target, truth)
    rows: dict[str, list[dict]] = {}
    errors = []
    for name, table in splits.items():
        rows[name] = []
        for r in table.select(["review_id", "user_id", "item_id", "rating", "text", "source", "line"]).to_pylist():
            text = truth_text.get(r["review_id"]) if target == "explanation" else r["text"]
            if not text or not tokenize(text):
                why = ("no ground-truth explanation for this review (no statements were extracted from it)"
                       if target == "explanation" and text is None else "the target text has no words")
                errors.append({"source": r["source"], "line": r["line"], "row_id": r["review_id"],
                               "field": "explanation" if target == "explanation" else "text",
                               "error_type": "no_target", "message": f"{name} split: {why}"})
                continue
            rows[name].append({**r, "target": text})
    if not rows["train"]:
        raise ValueError(f"no training example has a target in {split_dir} (target {target!r}"
                         + (f", ground truth {truth}" if truth else "") + "): nothing to train on")
    users = sorted({r["user_id"] for rs in rows.values() for r in rs})
    items = sorted({r["item_id"] for rs in rows.values() for r in rs})
    train_texts = [r["target"] for r in rows["train"]]
    vocab = LMTokens(tokenizer) if tokenizer else Vocabulary.build(train_texts, vocab_size)
    length = vocab.length if tokenizer else (lambda t: len(tokenize(t)))
    if max_words is None:
        max_words = default_max_words(train_texts, length=length)
    folder.mkdir(parents=True, exist_ok=True)
    _save_vocab(vocab, folder / "vocab.json")
    u_index = {u: i for i, u in enumerate(users)}
    i_index = {it: i for i, it in enumerate(items)}
    counts = {}
    for name, rs in rows.items():
        tokens = np.full((len(rs), max_words + 2), PAD, dtype=np.int64)
        cut = 0
        for k, r in enumerate(rs):
            ids = vocab.encode(r["target"], max_words)
            tokens[k, :len(ids)] = ids
            cut += length(r["target"]) > max_words
        write_npz(folder / f"{name}.npz", user=np.array([u_index[r["user_id"]] for r in rs], dtype=np.int64),
                 item=np.array([i_index[r["item_id"]] for r in rs], dtype=np.int64),
                 rating=np.array([r["rating"] for r in rs], dtype=np.float32), tokens=tokens)
        write_parquet_atomic(folder / f"examples-{name}.parquet", pa.Table.from_pylist(
            [{"example_id": r["review_id"], "user_id": r["user_id"], "item_id": r["item_id"],
              "rating": r["rating"], "reference": r["target"]} for r in rs], schema=EXAMPLES))
        counts[name] = len(rs)
        counts[f"{name}_cut"] = cut
    counts["no_target"] = len(errors)
    write_parquet_atomic(folder / "errors.parquet", error_rows(STAGE, errors))
    write_json_atomic(index_path, {"config_hash": want, "settings": settings, "users": users, "items": items,
                                   "target": target, "max_words": max_words, "vocab_size": len(vocab),
                                   "tokenizer": tokenizer,
                                   "counts": counts})
    unit = "LM tokens" if tokenizer else "words"
    progress(f"  data: {counts['train']:,} train / {counts['valid']:,} valid / {counts['test']:,} test examples, "
             f"{len(users):,} users, {len(items):,} items, {len(vocab):,} {unit}, targets cut at {max_words} {unit} "
             f"({counts['train_cut']:,} training targets were longer); {len(errors):,} review(s) without a "
             "target (errors.parquet)")
    return folder


@dataclass
class GenData:
    """The prepared arrays of one folder (see the module docstring)."""

    folder: Location
    vocab: Vocabulary | LMTokens
    index: dict
    arrays: dict[str, dict[str, np.ndarray]]
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: PathLike) -> GenData:
        folder = location(folder)
        index = read_index(folder)
        arrays = {name: read_npz(folder / f"{name}.npz") for name in SPLIT_NAMES}
        with local_copy(folder / "vocab.json") as path:
            vocab = LMTokens.load(path) if index.get("tokenizer") else Vocabulary.load(path)
        extras = read_npz(folder / EXTRAS) if (folder / EXTRAS).exists() else {}
        return cls(folder, vocab, index, arrays, extras)

    @property
    def n_users(self) -> int:
        return len(self.index["users"])

    @property
    def n_items(self) -> int:
        return len(self.index["items"])

    @property
    def max_words(self) -> int:
        return int(self.index["max_words"])

    def fingerprint(self) -> str:
        """A hash of the vocabulary and the user and item index: a checkpoint decodes only
        with the data it was trained on."""
        import hashlib

        h = hashlib.blake2b(digest_size=12)
        for part in (self.vocab.words, self.index["users"], self.index["items"], [str(self.max_words)]):
            h.update("\x1f".join(part).encode() + b"\x1e")
        for key in sorted(self.extras):  # XRec's embeddings and profiles are part of its input
            h.update(key.encode() + np.ascontiguousarray(self.extras[key]).tobytes())
        return h.hexdigest()

    def size(self, split: str) -> int:
        return len(self.arrays[split]["user"])

    def batch(self, split: str, rows: np.ndarray | torch.Tensor) -> Batch:
        """The rows as a Batch; tokens cut to the longest target among them."""
        a = self.arrays[split]
        rows = np.asarray(rows)
        tokens = a["tokens"][rows]
        width = int((tokens != PAD).sum(1).max()) if len(rows) else 1
        return Batch(torch.from_numpy(a["user"][rows]), torch.from_numpy(a["item"][rows]),
                     torch.from_numpy(a["rating"][rows]), torch.from_numpy(np.ascontiguousarray(tokens[:, :width])))

    def batches(self, split: str, batch_size: int, gen: torch.Generator | None = None) -> Iterator[Batch]:
        """Batches over a split, in a seeded random order when `gen` is given."""
        n = self.size(split)
        order = torch.randperm(n, generator=gen).numpy() if gen is not None else np.arange(n)
        for start in range(0, n, batch_size):
            yield self.batch(split, order[start:start + batch_size])

    def examples(self, split: str) -> pa.Table:
        return read_table(self.folder / f"examples-{split}.parquet", EXAMPLES)

    def errors(self) -> pa.Table:
        return data_errors(self.folder)


def read_index(folder: PathLike) -> dict:
    """A prepared folder's index.json: ids, lengths and counts, without its arrays (what
    a driver needs to plan)."""
    folder = location(folder)
    if not (folder / "index.json").exists():
        raise FileNotFoundError(f"{folder} holds no prepared generator data (no index.json)")
    return (folder / "index.json").read_json()


def data_errors(folder: PathLike) -> pa.Table:
    """The reviews a prepared folder has no target for (errors.parquet)."""
    return read_table(location(folder) / "errors.parquet", "errors")
