"""The study report's meta-evaluation section with `--ensemble-sweep`: Figure 4 as a
small table (mean [min, max] per N, read from ensemble_sweep.md) and the figure; without
the sweep, the section is as before."""
import pandas as pd

from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate
from rexeval.pipelines.study.report_model import Builder, Instance
from rexeval.pipelines.study.report_sections import section_meta_evaluate
from tests.pipelines.meta_evaluate.test_ensemble import wide


def _section(tmp_path, sweep: bool):
    src = wide(tmp_path / "wide.csv")
    folder = tmp_path / "meta"
    run_meta_evaluate(MetaEvaluateConfig(scores=str(src), out=str(folder), bootstrap=0, methods=["pearson"],
                                         judge_prefixes=["a_", "b_", "c_"], ensemble_sweep=sweep))
    inst = Instance(name="meta", step="meta", job="meta_evaluate", dataset=None, out=folder, status="complete",
                    reason=None, fingerprint=None, settings={}, seconds=1.0, finished=None, summary=None)
    return section_meta_evaluate(Builder(tmp_path, [inst]), inst), folder


def test_the_sweep_adds_figure_4_as_a_table_and_a_figure(tmp_path):
    sec, folder = _section(tmp_path, sweep=True)
    table = next(t for t in sec.tables if t.title.startswith("Figure 4 as a table"))
    assert table.columns == ["Aspect", "N", "subsets", "dataset", "user", "pair"]
    sweep = pd.read_parquet(folder / "ensemble_sweep.parquet")
    r = sweep[(sweep.n == 2) & (sweep.level == "dataset")].iloc[0]
    assert table.rows[1][:4] == ["persuasiveness", "2", "3",
                                 f"{r['mean'] * 100:.2f} [{r['min'] * 100:.2f}, {r['max'] * 100:.2f}]"]
    assert len(table.rows) == 3 and not sec.notes
    assert [f.title for f in sec.figures] == ["Figure 4: correlation against ensemble size (meta)"]
    assert sec.figures[0].data == (folder / "ensemble_sweep.png").read_bytes()


def test_without_the_sweep_nothing_is_added(tmp_path):
    sec, _ = _section(tmp_path, sweep=False)
    assert not sec.figures and not any("Figure 4" in t.title for t in sec.tables) and not sec.notes
