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
is lost: an explanation without a reference, a repeated (system, example), a statement
that cannot be written as a sentence, one whose value is not text, and a statement or
reference sentence that joins no explanation become error rows naming the file, the
row (1-based) and the field. A text column that holds numbers is refused before any
work: a cast would score "3" as an explanation.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePath

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.ground_truth import polarity, statement_sentence
from rexeval.pipelines.core.inputs import ID_COLUMNS, given_text, read_parts
from rexeval.pipelines.core.io import columns_found, json_lines, told_format
from rexeval.pipelines.core.schema import EXPLANATION_STATEMENTS, SchemaError, error_rows
from rexeval.storage import PathLike, is_uri, location
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


def read_references(path: PathLike) -> tuple[dict[str, str], dict[str, list[str]], dict[str, list[str]], list[dict]]:
    """(reference text, reference sentences, reference topics) by example id, from a
    ground-truth job folder, and an error row for each sentence whose example has no
    reference text there (it could never be scored, so it is said, not dropped)."""
    root = location(path)
    if not (root / "explanations").is_dir():
        raise FileNotFoundError(f"{given_text(path)} is not a ground-truth output folder (no explanations/ in it); "
                                "run `rexeval ground-truth` first, or leave --references out to use "
                                "each explanation row's own `reference` column")
    text: dict[str, str] = {}
    for _, expl in read_parts(path, "explanations", "explanations", sub="explanations"):
        text.update(zip(expl.column("example_id").to_pylist(), expl.column("explanation").to_pylist()))
    sentences: dict[str, list[str]] = {}
    topics: dict[str, list[str]] = {}
    errors: list[dict] = []
    if (root / "sentences").is_dir():
        for source, sent in read_parts(path, "sentences", "sentences", sub="sentences"):
            cols = (sent.column(c).to_pylist() for c in ("review_id", "sentence", "topic"))
            for n, (rid, s, t) in enumerate(zip(*cols), start=1):
                if rid not in text:
                    errors.append({"source": source, "line": n, "row_id": rid, "field": "review_id",
                                   "error_type": "no_reference_text",
                                   "message": f"{source}, row {n}: reference sentence of example {rid!r} has no "
                                              f"reference text in {given_text(path)}/explanations; it is not "
                                              "used (re-run `rexeval ground-truth` to rebuild the folder whole)",
                                   "raw": s})
                    continue
                sentences.setdefault(rid, []).append(s)
                if t:
                    topics.setdefault(rid, []).append(t)
    return text, sentences, topics, errors


def read_statement_rows(paths: Sequence[PathLike], rename: dict[str, str] | None = None
                        ) -> list[tuple[str, int, dict]]:
    """(source, 1-based row or line, fields) of every EXPLANATION_STATEMENTS row of a
    folder of Parquet parts or a Parquet, CSV, TSV or JSON-lines file, gzipped or not
    (local paths or URIs; the source is the file as given). `rename` maps our column
    names to the file's, its entries for this table's columns only (one mapping serves
    the explanations too). A JSON line's values are kept as written (`statement_sets`
    makes a value that is not text an error row); a column of the wrong type is refused
    whole."""
    names = EXPLANATION_STATEMENTS.names
    back = {theirs: ours for ours, theirs in (rename or {}).items() if ours in names}
    rows = []
    for path in paths:
        p, src = location(path), given_text(path)
        if not p.is_dir() and told_format(p, "explanation_statements") == "jsonl":
            rows += [(src, n, _statement_fields({back.get(k, k): v for k, v in obj.items()}, src, n, list(obj)))
                     for n, obj in json_lines(p, "explanation_statements")]
        else:
            for source, t in read_parts(path, EXPLANATION_STATEMENTS, "explanation_statements", rename=rename):
                rows += [(source, n, r) for n, r in enumerate(t.to_pylist(), start=1)]
    return rows


def _statement_fields(obj: dict, source: str, line: int, found: Sequence[str] = ()) -> dict:
    """One JSON line's EXPLANATION_STATEMENTS fields (renamed to ours); a field the table
    does not have, or a required one that is missing, is a mistake in the whole file
    (raised, naming the line, the fields `found` there as written and how to map them,
    as `io.validated` names a CSV's columns)."""
    names = EXPLANATION_STATEMENTS.names
    for k in obj:
        if k not in names:
            raise SchemaError("explanation_statements", source, k, line,
                              f"unexpected field (expected {', '.join(names)})"
                              + columns_found(found or obj, "jsonl"))
    for f in EXPLANATION_STATEMENTS:
        if not f.nullable and obj.get(f.name) is None:
            problem = "required field is missing"
            if f.name not in obj:  # absent, not null: perhaps under another name
                problem += columns_found(found or obj, "jsonl")
            raise SchemaError("explanation_statements", source, f.name, line, problem)
    return {n: obj.get(n) for n in names}


KINDS = {bool: "a yes/no value", int: "a number", float: "a number", list: "a list", dict: "an object"}


def _type_problem(r: dict) -> tuple[str, str] | None:
    """(field, why) for the first value of a statement row that is not of its column's
    kind: text for the texts, text or an integer for the ids."""
    for name in EXPLANATION_STATEMENTS.names:
        v = r[name]
        if v is None or isinstance(v, str):
            continue
        if name in ID_COLUMNS and isinstance(v, int) and not isinstance(v, bool):
            continue
        kind = next((k for t, k in KINDS.items() if isinstance(v, t)), "not text")
        return name, (f"{json.dumps(v, default=str)} is {kind} ({type(v).__name__}), not text; "
                      "the statement is not used")
    return None


def statement_sets(rows: list[tuple[str, int, dict]]) -> tuple[dict[tuple[str, str], list[str]], set[str], list[dict]]:
    """Sentences per (system, example) (duplicates within an example dropped), the
    systems seen, and error rows for statements that cannot be written as a sentence or
    hold a value that is not text (a number in a JSON line)."""
    sets: dict[tuple[str, str], list[str]] = {}
    systems: set[str] = set()
    errors: list[dict] = []
    memo: dict[tuple[str, str | None], str | tuple[str, ValueError]] = {}
    for source, n, r in rows:
        bad = _type_problem(r)
        if bad is None or bad[0] != "system":  # the system has statements, even unusable ones
            systems.add(str(r["system"]))
        if bad is not None:
            errors.append(_statement_error(source, n, r, bad[0], "bad_type", bad[1]))
            continue
        r = {**r, "example_id": str(r["example_id"]), "system": str(r["system"])}
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
            errors.append(_statement_error(source, n, r, field, f"bad_{field}", str(got)))
            continue
        lst = sets.setdefault((r["system"], r["example_id"]), [])
        if got not in lst:
            lst.append(got)
    return sets, systems, errors


def _statement_error(source: str, n: int, r: dict, field: str, kind: str, problem: str) -> dict:
    return {"source": source, "line": n, "row_id": f"{r['system']}/{r['example_id']}", "field": field,
            "error_type": kind, "message": f"{source}, row {n}, field '{field}': {problem}",
            "raw": json.dumps(r, ensure_ascii=False, sort_keys=True, default=str)}


def orphan_statements(rows: list[tuple[str, int, dict]], explained: set[tuple[str, str]],
                      systems: Sequence[str] | None = None) -> list[dict]:
    """An error row for each statement whose (system, example_id) names no explanation
    row: it can never be scored, and dropping it would hide a wrong id or system name.
    Statements of systems left out with `systems` are not the user's mistake."""
    errors = []
    for source, n, r in rows:
        if _type_problem(r) is not None:
            continue  # already an error row
        system, ex = str(r["system"]), str(r["example_id"])
        if (system, ex) in explained or (systems is not None and system not in systems):
            continue
        errors.append(_statement_error(
            source, n, {**r, "system": system, "example_id": ex}, "example_id", "no_explanation",
            f"no explanation of system {system!r} for example {ex!r} in the explanations given; the statement is "
            "not used (check the system name and example_id, or add that explanation)"))
    return errors


# Error types that are an input the user probably did not mean: each is also a warning.
WARNED = {"no_explanation": "statement row(s) join no explanation (system, example_id)",
          "no_reference_text": "reference sentence(s) have no reference text in the ground truth",
          "bad_type": "statement row(s) hold a value that is not text"}


def input_warnings(errors: pa.Table) -> list[str]:
    """One line per (kind, file) of the error rows in WARNED, for the job to print and
    record: these rows are easy to miss among the error counts."""
    found: dict[tuple[str, str], int] = {}
    for kind, source in zip(errors.column("error_type").to_pylist(), errors.column("source").to_pylist()):
        if kind in WARNED:
            found[(kind, source)] = found.get((kind, source), 0) + 1
    return [f"{source}: {n} {WARNED[kind]}; they are error rows ({kind}) in errors.parquet"
            for (kind, source), n in sorted(found.items(), key=lambda x: (x[0][1] or "", x[0][0]))]


def build_examples(explanations: pa.Table, references: PathLike | None = None,
                   statement_files: Sequence[PathLike] = (), limit: int | None = None,
                   systems: Sequence[str] | None = None, known_systems: Sequence[str] = (),
                   origins: Sequence[tuple[str, int]] | None = None, columns: dict[str, str] | None = None,
                   require_reference: bool = True) -> tuple[pa.Table, pa.Table, dict]:
    """(EXAMPLES, ERRORS, counts): every explanation row is an example or an error row,
    and so is every statement row and reference sentence. `known_systems` have statement
    sets even where no statement row names them (the extraction stage ran on them and
    found nothing in some explanations). `origins`: (file, 1-based row) of each
    explanation row (`read_explanation_rows`), named by its error rows. `columns`: our
    column names -> the statements tables' (their own columns' entries).
    `require_reference` False (no metric asked compares with a reference): an
    explanation without one is an example with reference "" (counted as
    `without_reference`), not an error row."""
    ref_text, ref_sent, ref_topics, errors = read_references(references) if references else ({}, {}, {}, [])
    statement_rows = read_statement_rows(statement_files, columns)
    gen_sets, gen_systems, bad_statements = statement_sets(statement_rows)
    errors += bad_statements
    explained = set(zip(explanations.column("system").to_pylist(), explanations.column("example_id").to_pylist()))
    errors += orphan_statements(statement_rows, explained, systems)
    gen_systems |= set(known_systems)
    if origins is None:
        origins = [("explanations", n) for n in range(1, explanations.num_rows + 1)]
    seen: set[tuple[str, str]] = set()
    per_system: dict[str, int] = {}
    without_reference = 0
    out: dict[str, list] = {f.name: [] for f in EXAMPLES}
    for (source, line), r in zip(origins, explanations.to_pylist()):
        system, ex = r["system"], r["example_id"]
        if systems is not None and system not in systems:
            continue
        rid = f"{system}/{ex}"
        if (system, ex) in seen:
            errors.append({"source": source, "line": line, "row_id": rid, "field": "example_id",
                           "error_type": "duplicate_example",
                           "message": f"{source}, row {line}: system {system!r} has example {ex!r} twice; "
                                      "the first one is scored", "raw": r["explanation"]})
            continue
        seen.add((system, ex))
        if limit is not None and per_system.get(system, 0) >= limit:
            continue
        reference = ref_text.get(ex) if references else r.get("reference")
        if reference is None and not require_reference:
            reference, without_reference = "", without_reference + 1
        if reference is None:
            where = f"the ground truth in {given_text(references)}" if references else "its `reference` column"
            errors.append({"source": source, "line": line, "row_id": rid, "field": "reference",
                           "error_type": "no_reference",
                           "message": f"{source}, row {line}: no reference for example {ex!r} in {where}",
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
              **{f"examples[{s}]": n for s, n in sorted(per_system.items())},
              **({"without_reference": without_reference} if without_reference else {})}
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
