"""A driver's leases on Serve applications (serve/common.AppLease), without Serve: jobs
running at once in one driver share an app, and it is stopped only when the last one
releases it; Serve itself is shut down only if this driver started it, after its last
lease."""
from __future__ import annotations

import threading

import pytest

from rexeval.serve import common


class FakeServe:
    def __init__(self, running: bool = False):
        self.up, self.apps, self.calls = running, set(), []

    def start(self, name):
        self.up = True
        self.apps.add(name)
        self.calls.append(("start", name))

    def delete(self, name):
        self.apps.discard(name)
        self.calls.append(("delete", name))

    def shutdown(self):
        self.up, self.apps = False, set()
        self.calls.append(("shutdown",))


@pytest.fixture
def fake(monkeypatch):
    f = FakeServe()
    monkeypatch.setattr(common, "running_apps", lambda: set(f.apps))
    monkeypatch.setattr(common, "serve_running", lambda: f.up)
    monkeypatch.setattr(common.serve, "delete", f.delete)
    monkeypatch.setattr(common.serve, "shutdown", f.shutdown)
    monkeypatch.setattr(common, "_HELD", {})
    monkeypatch.setattr(common, "_SERVE_STARTED_HERE", [False])
    return f


def lease(name="app"):
    return common.AppLease(name, "test", progress=lambda _: None)


def test_one_job_leaves_the_cluster_as_found(fake):
    a = lease()
    a.acquire(lambda: fake.start("app"), "m", "here")
    assert a.started and a.started_serve and fake.apps == {"app"}
    a.release()
    assert fake.calls == [("start", "app"), ("shutdown",)]
    a.release()  # twice is harmless
    assert fake.calls[-1] == ("shutdown",) and len(fake.calls) == 2


def test_jobs_at_once_share_the_app_until_the_last_releases(fake):
    first, second = lease(), lease()
    barrier = threading.Barrier(2)

    def job(x):
        barrier.wait()
        x.acquire(lambda: fake.start("app"), "m", "here")

    threads = [threading.Thread(target=job, args=(x,)) for x in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == [("start", "app")]  # started once
    starter, user = (first, second) if first.started else (second, first)
    starter.release()  # the starter ends first: the other still sends requests
    assert fake.apps == {"app"} and fake.calls == [("start", "app")]
    user.release()
    assert fake.calls == [("start", "app"), ("shutdown",)]


def test_serve_stays_up_while_another_app_of_this_driver_is_held(fake):
    judge, nli = lease("judge"), lease("nli")
    judge.acquire(lambda: fake.start("judge"), "m", "here")  # starts Serve too
    nli.acquire(lambda: fake.start("nli"), "m", "here")
    judge.release()
    assert fake.up and fake.apps == {"nli"} and fake.calls[-1] == ("delete", "judge")
    nli.release()
    assert fake.calls[-1] == ("shutdown",) and not fake.up


def test_an_app_someone_else_runs_is_left_running(fake):
    fake.start("app")
    fake.calls.clear()
    a = lease()
    a.acquire(lambda: pytest.fail("must not start"), "m", "here")
    a.release()
    assert fake.calls == [] and fake.apps == {"app"}


def test_a_lease_never_released_does_not_outlive_its_app(fake):
    leaked = lease()
    leaked.acquire(lambda: fake.start("app"), "m", "here")
    fake.shutdown()  # someone shut Serve down under it; the lease was never released
    again = lease()
    again.acquire(lambda: fake.start("app"), "m", "here")
    assert again.started and again.started_serve  # started afresh, not "shared" with a ghost
    again.release()
    assert fake.calls[-1] == ("shutdown",)
