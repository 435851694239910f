"""Rubric files: shipped ones load, overrides and bad files give clear errors."""
import pytest

from rexeval.prompts.errors import PromptError
from rexeval.prompts.rubrics import list_rubrics, load_rubric


def test_alert_criteria_has_the_four_criteria():
    r = load_rubric("alert_criteria")
    assert r.names == ["reasoning", "clear_language", "engaging_narrative", "neutral_tone"]
    assert r.version.startswith("alert_criteria/v1-")
    assert "alert_criteria" in list_rubrics()
    assert r.subset(["neutral_tone", "reasoning"]).names == ["reasoning", "neutral_tone"]
    with pytest.raises(PromptError, match="no item"):
        r.subset(["tone"])


def test_a_rubric_file_by_path_and_its_errors(tmp_path):
    good = tmp_path / "mine.yaml"
    good.write_text("name: other\nversion: 2\ndescription: d\nitems:\n"
                    "  - {name: brevity, title: Brevity, description: Short.}\n")
    r = load_rubric(str(good))
    assert r.names == ["brevity"] and r.version.startswith("other/v2-")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: 1\ndescription: d\nitems:\n  - {name: Brevity, title: B, description: x}\n")
    with pytest.raises(PromptError, match="lower-case"):
        load_rubric(str(bad))
    with pytest.raises(PromptError, match="unknown rubric"):
        load_rubric("no_such_rubric")
