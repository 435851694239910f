"""Item metadata (`rexeval ingest --meta`): a damaged file is named in one line, not a
traceback (pipelines/ingest/metadata.py)."""
import gzip
from pathlib import Path

import pytest

from rexeval.pipelines.ingest.metadata import load_titles

ITEMS = Path(__file__).resolve().parents[3] / "pipelines" / "sample" / "items.jsonl"


def test_titles_are_read():
    t = load_titles([str(ITEMS)])
    assert t.num_rows > 0 and t.column("item_title").null_count == 0


def test_a_cut_gzip_is_named(tmp_path):
    cut = tmp_path / "meta.jsonl.gz"
    cut.write_bytes(gzip.compress(ITEMS.read_bytes())[:300])
    with pytest.raises(ValueError, match=r"meta.jsonl.gz: the file ends early or is damaged \(EOFError"):
        load_titles([str(cut)])


def test_a_broken_csv_is_named(tmp_path):
    bad = tmp_path / "meta.csv"
    bad.write_text('asin,title\n"B1,x\n')
    with pytest.raises(ValueError, match="meta.csv: not a readable metadata CSV"):
        load_titles([str(bad)])


def test_a_file_that_is_not_metadata_is_named(tmp_path):
    garbage = tmp_path / "meta.jsonl"
    garbage.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ValueError, match="meta.jsonl: not item metadata"):
        load_titles([str(garbage)])
