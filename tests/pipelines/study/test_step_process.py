"""A step's process that dies while joining the Ray cluster ran nothing of its job, so it
is started again; one that dies after joining is a failed step (the process is scripted
here: what the parent does with each outcome is the point)."""
import pytest

from rexeval.pipelines.study import step_process as sp

CALL = sp.StepCall(key="x@d", target="m:f", config=dict, settings={}, overwrite=False, log_path="/logs/x@d.log")


def scripted(monkeypatch, outcomes: list[tuple]) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(sp, "_run_step_once", lambda call, progress, pool=None: outcomes.pop(0))
    return lines


def test_a_process_that_died_joining_the_cluster_is_started_again(monkeypatch):
    lines = scripted(monkeypatch, [(False, None, 1), (True, ("done", {"rows": 3}), 0)])
    assert sp.run_step(CALL, lines.append) == {"rows": 3}
    assert lines == ["[x@d] the step's process ended (exit code 1) while joining the Ray cluster; "
                     "starting it again (2/3)"]


def test_a_process_that_died_after_joining_fails_the_step_at_once(monkeypatch):
    outcomes = [(True, None, -9), (True, ("done", {}), 0)]
    lines = scripted(monkeypatch, outcomes)
    with pytest.raises(sp.StepFailed, match=r"StepDied: .*killed by signal 9.*/logs/x@d.log"):
        sp.run_step(CALL, lines.append)
    assert lines == [] and len(outcomes) == 1


def test_joining_is_tried_a_bounded_number_of_times(monkeypatch):
    lines = scripted(monkeypatch, [(False, None, 1)] * sp.JOIN_TRIES)
    with pytest.raises(sp.StepFailed, match="StepDied: .*exit code 1"):
        sp.run_step(CALL, lines.append)
    assert len(lines) == sp.JOIN_TRIES - 1
