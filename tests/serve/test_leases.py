"""Two drivers of one Ray cluster share a Serve application through the cluster's lease
book (serve/leases.py): the first starts it, the second uses it, the first to finish
leaves it running for the second, and it goes when the last one ends.

The drivers are separate processes joined to the session's Ray, each its own Ray job, as
two `ray job submit` drivers are; the app is a one-line deployment of no CPU, so the
test pins the sharing rules, not a model.

The book outlives its keeper: the state is in the GCS key-value store, so a keeper that
Ray restarts (or a driver makes again) still knows who holds which app, and the app a
job started is deleted when its last holder ends.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from rexeval.serve import common
from rexeval.serve.leases import TTL_S, LeaseBook

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


@pytest.mark.slow
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


# -- the book outlives its keeper ---------------------------------------------------------


def kill_and_await_restart(handle, timeout: float = 60) -> None:
    """Kill an actor's worker and return once Ray has restarted it (a call made before that
    could still reach the old process, whose memory the book would be read from)."""
    import ray
    from ray._private import state

    from tests.doubles.local_cluster import wait_for

    actor_id = handle._actor_id.hex()
    restarts = state.actors(actor_id)["NumRestarts"]
    ray.kill(handle, no_restart=False)
    wait_for(lambda: (a := state.actors(actor_id))["NumRestarts"] > restarts and a["State"] == "ALIVE",
             timeout, "the keeper's restart")


def test_the_books_state_is_taken_over_by_a_new_process():
    """What one keeper dumps, the next one loads: the apps, their holders (beaten afresh
    by the new clock), who is starting what, whether a lease started Serve."""
    now = [1000.0]
    old = LeaseBook(clock=lambda: now[0])
    assert old.begin("judge", "a", False, False) == "start"
    old.started("judge", "a")
    assert old.begin("judge", "b", True, True) == "use"
    assert old.begin("nli", "c", False, True) == "start"  # being started when the keeper died

    clock = [5.0]  # another process: its clock has nothing to do with the old one's
    new = LeaseBook(clock=lambda: clock[0])
    new.load(old.dump())
    assert new.dump() == old.dump()
    assert new.holders("judge") == 2 and new.begin("nli", "d", False, True) == "wait"
    assert new.end("judge", "a", True) == "keep"  # b still holds it
    new.beat(["b"])
    clock[0] += TTL_S + 1  # c never beats again (its driver died with the keeper): it expires
    assert new.begin("nli", "d", False, True) == "start"
    assert new.end("judge", "b", True) == "delete"
    fresh = LeaseBook()
    fresh.load(None)  # nothing saved yet: an empty book
    assert fresh.apps == {} and fresh.serve_started is False


def test_an_end_asked_again_gets_the_first_answer():
    """A keeper that dies mid-call may have ended the holder before its reply was lost; the
    driver asks again (on the keeper read back from the store) and must still be told to
    delete, not "keep" because the holder is no longer in the book."""
    book = LeaseBook()
    assert book.begin("app", "h1", False, True) == "start"
    book.started("app", "h1")
    assert book.end("app", "h1", True) == "delete"
    again = LeaseBook()
    again.load(book.dump())
    assert again.end("app", "h1", True) == "delete" and book.end("app", "h1", True) == "delete"
    # The same holder's next lease round is a new question.
    assert book.begin("app", "h1", True, True) == "use"
    assert book.end("app", "h1", True) == "keep"  # running before this round: not its to delete


@pytest.mark.slow
def test_a_keeper_killed_mid_lease_comes_back_with_the_book(ray_session):
    """The real keeper actor, killed twice while an app is held: Ray restarts it, then a
    driver makes a new one; both read the book back from the GCS key-value store."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    from rexeval.serve.leases import KEEPER_NAMESPACE, STATE_NAMESPACE, RayBook, keeper, state_key

    name = f"rexeval-serve-leases-test-{uuid.uuid4().hex[:8]}"
    book = RayBook(name)
    try:
        assert book.begin("app", "h1", False, True) == "start"
        book.started("app", "h1")
        assert book.begin("app", "h2", True, True) == "use"
        assert _internal_kv_get(state_key(name), namespace=STATE_NAMESPACE)

        kill_and_await_restart(keeper(name))  # its worker dies; Ray restarts the actor
        assert book.holders("app") == 2
        assert book.end("app", "h1", True) == "keep"

        ray.kill(keeper(name), no_restart=True)  # gone for good: the next call makes a new one
        assert book.end("app", "h2", True) == "delete"
    finally:
        try:
            ray.kill(ray.get_actor(name, namespace=KEEPER_NAMESPACE), no_restart=True)
        except ValueError:
            pass
        _internal_kv_del(state_key(name), namespace=STATE_NAMESPACE)


RESTART_APP = "rexeval-lease-restart-test"


@pytest.mark.slow
def test_an_app_started_before_the_keeper_restarted_is_deleted_at_the_end(ray_session):
    """A job's lease on an app it started; the cluster's keeper is killed mid-lease and Ray
    restarts it: the job's release still deletes the app (with a book in memory only, the
    restarted keeper knew nothing of it and left it running for ever)."""
    from ray import serve

    from rexeval.serve.leases import RayBook, keeper

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Echo:
        def __call__(self, request):
            return "ok"

    lines: list[str] = []
    lease = common.AppLease(RESTART_APP, "test", progress=lines.append)
    try:
        lease.acquire(lambda: serve.run(Echo.bind(), name=RESTART_APP, route_prefix="/lease-restart"), "echo", "here")
        assert lease.started and RESTART_APP in common.running_apps()
        kill_and_await_restart(keeper())
        assert RayBook().holders(RESTART_APP) == 1  # the restarted keeper knows the job
        lease.release()
        assert any(f"stopped the Serve application {RESTART_APP!r}" in x for x in lines), lines
        assert RESTART_APP not in common.running_apps()
    finally:
        if RESTART_APP in common.running_apps():
            serve.delete(RESTART_APP)
