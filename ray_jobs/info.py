"""`rexeval info`: dataset statistics in the layout of seed 000's Table II.

The tables are read and counted by Ray workers (`stats.dataset_stats_ray`): the command
holds the counts, never a table, so it runs as well on a dataset larger than its machine."""
from __future__ import annotations

import click

from rexeval.pipelines.core.inputs import given_text, resolved_text, reviews_input, table_rows
from rexeval.pipelines.core.io import table_files
from rexeval.pipelines.core.runtime import key_groups, read_dataset
from rexeval.pipelines.core.schema import SPLIT_NAMES
from rexeval.storage import PathLike, location
from rexeval.pipelines.ingest.stats import dataset_stats_ray, format_table
from rexeval.ray_jobs.common import Where, columns_option, echo_json, user_errors


def load_dataset(path: PathLike, columns: dict[str, str] | None = None) -> tuple[dict, int]:
    """A split folder gives its three splits; anything else is one reviews table (a local
    path or a URI; a file in any table format), as Ray Datasets ({"train", "valid",
    "test"} or {"all"}), with its number of rows (from the footers). A dataset with no
    review is refused: a table of zeros would read as statistics of a real, empty
    dataset. `columns`: our column names -> the table's."""
    p = location(path)
    if all((p / n).exists() for n in SPLIT_NAMES):
        rows = table_rows([f for n in SPLIT_NAMES for f in table_files(p / n)])
        if rows == 0:
            raise ValueError(f"{given_text(path)}: the split has 0 rows in train/, valid/ and test/; split a "
                             "reviews table that has reviews (`rexeval split INGEST_FOLDER --out ...`)")
        return {n: read_dataset(p / n, "reviews", rename=columns) for n in SPLIT_NAMES}, rows or 0
    source = reviews_input(p)
    return {"all": read_dataset(source, "reviews", rename=columns)}, table_rows(table_files(source)) or 0


def dataset_name(path: PathLike) -> str:
    p = location(resolved_text(path))
    return p.parent.name if p.name in ("split", "ingest", "reviews") else p.name


@click.command("info")
@click.argument("paths", nargs=-1, required=True, type=Where(exists=True))
@click.option("--name", "names", multiple=True, help="Column name per PATH (default: folder name).")
@click.option("--statements", type=Where(exists=True),
              help="A statements table: adds the Statements rows (averages, unique, total).")
@columns_option
@click.option("--markdown", is_flag=True, help="Print a Markdown table.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw numbers as JSON.")
@user_errors
def info_cmd(paths, names, statements, columns, markdown, as_json):
    """Print dataset statistics (users, items, interactions, split sizes, statements)
    for one or more datasets side by side, as in seed 000's Table II.

    Each PATH is a `rexeval split` output folder, an ingest folder or a reviews table
    (Parquet, CSV, TSV or JSON lines, gzipped or not), a local path or a URI; so is
    --statements. --columns maps your column names to ours in both.

    \b
    Examples:
      rexeval info runs/toys/split runs/sports/split
      rexeval info reviews.csv.gz --columns user_id=reviewer,item_id=asin,timestamp=time
    """
    if names and len(names) != len(paths):
        raise click.UsageError("give one --name per PATH")
    st = read_dataset(statements, "statements", rename=columns) if statements else None
    st_rows = (table_rows(table_files(statements)) or 0) if statements else 0
    stats = {}
    for i, p in enumerate(paths):
        data, rows = load_dataset(p, columns)
        stats[names[i] if names else dataset_name(p)] = dataset_stats_ray(data, st, key_groups(rows + st_rows))
    if as_json:
        echo_json(stats)
    else:
        click.echo(format_table(stats, markdown=markdown))
    return stats


def main():  # python -m ray_jobs.info
    info_cmd()


if __name__ == "__main__":
    main()
