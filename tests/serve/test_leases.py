"""Two drivers of one Ray cluster share a Serve application through the cluster's lease
book (serve/leases.py): the first starts it, the second uses it, the first to finish
leaves it running for the second, and it goes when the last one ends.

The drivers are separate processes joined to the session's Ray, each its own Ray job, as
two `ray job submit` drivers are; the app is a one-line deployment of no CPU, so the
test pins the sharing rules, not a model.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from rexeval.serve import common

pytestmark = pytest.mark.slow
APP = "rexeval-lease-test"

DRIVER = textwrap.dedent(f"""
    import sys
    import ray
    from ray import serve
    from rexeval.serve.common import AppLease

    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

    @serve.deployment(num_replicas=1, ray_actor_options={{"num_cpus": 0}})
    class Echo:
        def __call__(self, request):
            return "ok"

    lease = AppLease({APP!r}, "test", progress=lambda line: print(line.strip(), flush=True))
    lease.acquire(lambda: serve.run(Echo.bind(), name={APP!r}, route_prefix="/lease-test"), "echo", "here")
    print("ACQUIRED", flush=True)
    sys.stdin.readline()  # the test says when this job ends
    lease.release()
    print("RELEASED", flush=True)
""")


class Driver:
    def __init__(self, address: str):
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, address], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []

    def until(self, word: str, timeout: float = 120) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if line.strip() == word:
                return self.lines
        raise AssertionError(f"the driver did not print {word}:\n" + "\n".join(self.lines[-40:]))

    def end(self) -> list[str]:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        lines = self.until("RELEASED")
        assert self.proc.wait(60) == 0, "\n".join(lines)
        return lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_the_first_driver_to_finish_leaves_the_app_to_the_second(ray_session):
    address = ray_session.get_runtime_context().gcs_address
    first, second = Driver(address), None
    try:
        started = first.until("ACQUIRED")
        second = Driver(address)
        assert any(f"starting the Serve deployment {APP!r}" in x for x in started), started
        used = second.until("ACQUIRED")
        assert any(f"using the running Serve application {APP!r} (shared with another job)" in x
                   for x in used), used
        assert not any("starting the Serve deployment" in x for x in used)

        ended = first.end()  # the driver that started it ends first
        assert not any("stopped the Serve application" in x for x in ended), ended
        assert APP in common.running_apps()  # still there for the second driver

        ended = second.end()  # the last one ends: the app goes, though it did not start it
        assert any(f"stopped the Serve application {APP!r}" in x for x in ended), ended
        assert APP not in common.running_apps()
    finally:
        for driver in (first, second):
            if driver is not None:
                driver.kill()
