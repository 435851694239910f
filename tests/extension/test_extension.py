"""Extension holds end to end: a scratch copy of the checkout with one planted file of
each kind (a metric, a prompted generator, a pairwise evaluator, a study job) passes the
suite's contract tests and a test that follows the planted files through the product
(tests/extension/plant.py, scripts/check_extension.py; `--full` runs the whole suite)."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extension.plant import PLACES, PLANTED, REPO, planted_here, scratch_checkout

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(planted_here(), reason="a scratch copy with the planted files: nothing to plant")]


def test_each_planted_kind_is_one_new_file_in_its_folder(tmp_path):
    main = scratch_checkout(tmp_path)
    for name, place in PLACES.items():
        assert not (REPO / place).exists(), place  # new files, not edits of the product
        assert (main / place).read_bytes() == (PLANTED / name).read_bytes()


def test_the_contract_tests_pass_with_the_planted_extensions(tmp_path):
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "check_extension.py"), "--dest", str(tmp_path),
                          "--workers", "0", "--", "-q"],
                         capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert "test_planted_extensions.py" in res.stdout or "passed" in res.stdout
