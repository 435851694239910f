"""What `rexeval evaluate` scores: one row per (system, example) with both texts and both
statement sets, built from the user's files.

- Explanations: EXPLANATIONS tables (a file, a folder of parts, or a ground-truth job
  folder, whose `explanations/` is read); one table may hold several systems.
- References: a ground-truth job folder (seed 000's rule-built explanations and, in
  `sentences/`, one sentence per reference statement in the ground-truth pattern), or,
  without one, each explanation row's own `reference` text (then no reference
  statements, and the statement-level metrics say so).
- Statements of generated explanations: EXPLANATION_STATEMENTS tables (Parquet, or
  JSON lines with the same fields), usually the extraction stage's output mapped back
  (`rexeval evaluate --extract`). Each is written as a sentence in the ground-truth
  pattern (`pipelines.extract.ground_truth.statement_sentence`), as seed 000 IV-B does for
  both sides, so both statement sets read alike.

A system that has no statement rows at all has unknown statement sets (the metrics
that need them are skipped for it, with the reason); a system with statements for some
examples has an empty set for the others (the metrics' empty policy applies). Nothing
is lost: an explanation without a reference, a repeated (system, example), or a
statement that cannot be written as a sentence becomes an error row with the reason.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePath

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.ground_truth import polarity, statement_sentence
from rexeval.pipelines.core.inputs import given_text
from rexeval.pipelines.core.io import json_lines, read_table
from rexeval.pipelines.core.schema import EXPLANATION_STATEMENTS, error_rows, validate_table
from rexeval.pipelines.core.storage import Location, PathLike, is_uri, location
from rexeval.pipelines.evaluate.config import FLIP_OUTPUTS

STAGE = "evaluate"
FLIP = {"positive": "negative", "negative": "positive", "neutral": "neutral"}

EXAMPLES = pa.schema([
    pa.field("example_id", pa.string(), nullable=False),
    pa.field("system", pa.string(), nullable=False),
    pa.field("user_id", pa.string()),
    pa.field("item_id", pa.string()),
    pa.field("explanation", pa.string(), nullable=False),
    pa.field("reference", pa.string(), nullable=False),
    pa.field("gen_sentences", pa.list_(pa.string())),  # null: statements unknown
    pa.field("ref_sentences", pa.list_(pa.string())),  # null: statements unknown
    pa.field("ref_topics", pa.list_(pa.string())),
])


def _table_path(path: PathLike, sub: str) -> Location:
    """A job folder's `sub` table when `path` is one, else `path` itself."""
    p = location(path)
    return p / sub if (p / sub).is_dir() else p


def read_explanations(paths: Sequence[PathLike]) -> pa.Table:
    if not paths:
        raise ValueError("no explanations given")
    parts = [read_table(_table_path(p, "explanations"), "explanations") for p in paths]
    return pa.concat_tables(parts)


def reference_kind(paths: Sequence[PathLike]) -> str | None:
    """What the explanations' own `reference` column holds, from the manifests of the
    `rexeval generate run` folders among `paths`: "review" (generators trained on the
    review text, seed 000 Table VII), "explanation", or None when no input says. Inputs
    that say different things are refused: their systems would be scored against
    different kinds of reference in one table."""
    said: dict[str, list[str]] = {}
    for p in paths:
        manifest = location(p) / "manifest.json"
        if manifest.is_file():
            try:
                target = manifest.read_json().get("target")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                raise ValueError(f"{manifest}: not a readable job manifest (a JSON object)") from None
            if target:
                said.setdefault(str(target), []).append(str(p))
    if len(said) > 1:
        raise ValueError("the explanations were generated for different targets (" + "; ".join(
            f"{t}: {', '.join(ps)}" for t, ps in sorted(said.items())) + "); evaluate each target in its own run")
    return next(iter(said), None)


def read_references(path: PathLike) -> tuple[dict[str, str], dict[str, list[str]], dict[str, list[str]]]:
    """(reference text, reference sentences, reference topics) by example id, from a
    ground-truth job folder."""
    root = location(path)
    if not (root / "explanations").is_dir():
        raise FileNotFoundError(f"{given_text(path)} is not a ground-truth output folder (no explanations/ in it); "
                                "run `rexeval ground-truth` first, or leave --references out to use "
                                "each explanation row's own `reference` column")
    expl = read_table(root / "explanations", "explanations")
    text = dict(zip(expl.column("example_id").to_pylist(), expl.column("explanation").to_pylist()))
    sentences: dict[str, list[str]] = {}
    topics: dict[str, list[str]] = {}
    if (root / "sentences").is_dir():
        sent = read_table(root / "sentences", "sentences")
        for rid, s, t in zip(sent.column("review_id").to_pylist(), sent.column("sentence").to_pylist(),
                             sent.column("topic").to_pylist()):
            sentences.setdefault(rid, []).append(s)
            if t:
                topics.setdefault(rid, []).append(t)
    return text, sentences, topics


def read_statement_rows(paths: Sequence[PathLike]) -> list[tuple[str, int, dict]]:
    """(source, row, fields) of every EXPLANATION_STATEMENTS row of Parquet or JSONL files
    (local paths or URIs; the source is the path as given)."""
    rows = []
    for path in paths:
        p, src = location(path), given_text(path)
        if p.suffix in (".jsonl", ".json"):
            for n, obj in json_lines(p, "explanation_statements"):
                t = validate_table(pa.Table.from_pylist([obj]), EXPLANATION_STATEMENTS, source=f"{src} line {n}",
                                   name="explanation_statements")
                rows.append((src, n, t.to_pylist()[0]))
        else:
            t = read_table(p, EXPLANATION_STATEMENTS)
            rows += [(src, i, r) for i, r in enumerate(t.to_pylist())]
    return rows


def statement_sets(rows: list[tuple[str, int, dict]]) -> tuple[dict[tuple[str, str], list[str]], set[str], list[dict]]:
    """Sentences per (system, example) (duplicates within an example dropped), the
    systems seen, and error rows for statements that cannot be written as a sentence."""
    sets: dict[tuple[str, str], list[str]] = {}
    systems: set[str] = set()
    errors: list[dict] = []
    memo: dict[tuple[str, str | None], str | tuple[str, ValueError]] = {}
    for source, n, r in rows:
        systems.add(r["system"])
        key = (r["statement"], r["sentiment"])
        if key not in memo:
            try:
                polarity(r["sentiment"])
            except ValueError as exc:
                memo[key] = ("sentiment", exc)
            else:
                try:
                    memo[key] = statement_sentence(r["statement"], r["sentiment"])
                except ValueError as exc:
                    memo[key] = ("statement", exc)
        got = memo[key]
        if isinstance(got, tuple):
            field, got = got
            errors.append({"source": source, "line": n, "row_id": f"{r['system']}/{r['example_id']}",
                           "field": field, "error_type": f"bad_{field}",
                           "message": f"{source}, row {n}, field '{field}': {got}",
                           "raw": json.dumps(r, ensure_ascii=False, sort_keys=True)})
            continue
        lst = sets.setdefault((r["system"], r["example_id"]), [])
        if got not in lst:
            lst.append(got)
    return sets, systems, errors


def build_examples(explanations: pa.Table, references: PathLike | None = None,
                   statement_files: Sequence[PathLike] = (), limit: int | None = None,
                   systems: Sequence[str] | None = None, known_systems: Sequence[str] = ()
                   ) -> tuple[pa.Table, pa.Table, dict]:
    """(EXAMPLES, ERRORS, counts): every explanation row is an example or an error row.
    `known_systems` have statement sets even where no statement row names them (the
    extraction stage ran on them and found nothing in some explanations)."""
    ref_text, ref_sent, ref_topics = read_references(references) if references else ({}, {}, {})
    gen_sets, gen_systems, errors = statement_sets(read_statement_rows(statement_files))
    gen_systems |= set(known_systems)
    seen: set[tuple[str, str]] = set()
    per_system: dict[str, int] = {}
    out: dict[str, list] = {f.name: [] for f in EXAMPLES}
    for i, r in enumerate(explanations.to_pylist()):
        system, ex = r["system"], r["example_id"]
        if systems is not None and system not in systems:
            continue
        rid = f"{system}/{ex}"
        if (system, ex) in seen:
            errors.append({"row_id": rid, "field": "example_id", "error_type": "duplicate_example",
                           "message": f"explanations row {i}: system {system!r} has example {ex!r} twice; "
                                      "the first one is scored", "raw": r["explanation"]})
            continue
        seen.add((system, ex))
        if limit is not None and per_system.get(system, 0) >= limit:
            continue
        reference = ref_text.get(ex) if references else r.get("reference")
        if reference is None:
            where = f"the ground truth in {references}" if references else "its `reference` column"
            errors.append({"row_id": rid, "field": "reference", "error_type": "no_reference",
                           "message": f"explanations row {i}: no reference for example {ex!r} in {where}",
                           "raw": r["explanation"]})
            continue
        per_system[system] = per_system.get(system, 0) + 1
        out["example_id"].append(ex)
        out["system"].append(system)
        out["user_id"].append(r.get("user_id"))
        out["item_id"].append(r.get("item_id"))
        out["explanation"].append(r["explanation"])
        out["reference"].append(reference)
        out["gen_sentences"].append(gen_sets.get((system, ex), []) if system in gen_systems else None)
        out["ref_sentences"].append(ref_sent.get(ex, []) if references else None)
        out["ref_topics"].append(sorted(set(ref_topics.get(ex, []))))
    examples = pa.table(out, schema=EXAMPLES)
    err = error_rows(STAGE, errors)
    counts = {"examples": examples.num_rows, "errors": err.num_rows, "systems": len(per_system),
              **{f"examples[{s}]": n for s, n in sorted(per_system.items())}}
    return examples, err, counts


def sentiment_flipped(statements: pa.Table, system: str | None = None) -> pa.Table:
    """The same statements with positive and negative swapped (neutral kept): the
    demo's deliberately unfaithful system. Works on STATEMENTS and
    EXPLANATION_STATEMENTS tables; `system` renames the system column when present."""
    flipped = [FLIP.get((s or "").strip().lower(), s) for s in statements.column("sentiment").to_pylist()]
    t = statements.set_column(statements.schema.get_field_index("sentiment"), "sentiment",
                              pa.array(flipped, pa.string()))
    if system is not None and "system" in t.column_names:
        t = t.set_column(t.schema.get_field_index("system"), "system",
                         pa.array([system] * t.num_rows, pa.string()))
    return t


def explanation_statements(statements: pa.Table, system: str) -> pa.Table:
    """A STATEMENTS table (review_id = example id) as EXPLANATION_STATEMENTS of `system`."""
    return pa.table({"example_id": statements.column("review_id"),
                     "system": pa.array([system] * statements.num_rows, pa.string()),
                     "statement": statements.column("statement"),
                     "topic": statements.column("topic"),
                     "sentiment": statements.column("sentiment")}, schema=EXPLANATION_STATEMENTS)


def systems_of(examples: pa.Table) -> list[str]:
    return sorted(pc.unique(examples.column("system")).to_pylist())


def write_flip_benchmark(statements: pa.Table, root: PathLike, system: str = "flipped") -> dict[str, str]:
    """The demo's two systems from one STATEMENTS table: the rule-built ground truth
    (also the reference) and a copy with every sentiment flipped, written as a
    ground-truth folder, one explanations table and one statements table. Both
    systems' statements are known by construction (the rules that wrote the texts)."""
    from rexeval.pipelines.extract.ground_truth import ground_truth_tables
    from rexeval.pipelines.core.io import write_parquet_atomic
    from rexeval.pipelines.core.schema import EXPLANATIONS

    given, root = given_text(root), location(root)
    truth, sentences = ground_truth_tables(statements)
    flipped_st = sentiment_flipped(statements)
    flipped, _ = ground_truth_tables(flipped_st)
    flipped = flipped.set_column(flipped.schema.get_field_index("system"), EXPLANATIONS.field("system"),
                                 pa.array([system] * flipped.num_rows, pa.string()))
    gt_system = truth.column("system")[0].as_py() if truth.num_rows else "ground_truth"
    # The paths returned as the caller named the folder (a URI, or a local path as given).
    names = {k: FLIP_OUTPUTS[k] for k in ("references", "explanations", "statements")}
    paths = {k: str(root / n) if is_uri(given) else str(PurePath(given) / n) for k, n in names.items()}
    write_parquet_atomic(root / FLIP_OUTPUTS.references / "explanations" / "part-00000.parquet", truth)
    write_parquet_atomic(root / FLIP_OUTPUTS.references / "sentences" / "part-00000.parquet", sentences)
    write_parquet_atomic(root / FLIP_OUTPUTS.explanations, pa.concat_tables([truth, flipped]))
    write_parquet_atomic(root / FLIP_OUTPUTS.statements, pa.concat_tables(
        [explanation_statements(statements, gt_system), explanation_statements(flipped_st, system)]))
    return paths
