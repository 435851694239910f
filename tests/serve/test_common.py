"""Leases on Serve applications (serve/common.AppLease over serve/leases.LeaseBook),
without Serve or Ray: jobs running at once (in one driver or in several) share an app,
and it is stopped only when the last one releases it; Serve itself is shut down only if
a lease started it, after the last lease; a holder whose driver died stops counting."""
from __future__ import annotations

import threading
import time

import pytest

from rexeval.serve import common
from rexeval.serve.leases import LeaseBook


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
    f.book = LeaseBook(clock=lambda: f.now)
    f.now = 0.0
    return f


BOOK: list[LeaseBook] = []


@pytest.fixture(autouse=True)
def _book(fake):
    BOOK[:] = [fake.book]
    yield
    BOOK.clear()


def lease(name="app"):
    """A lease on the test's book (one book stands for the cluster's keeper, whichever
    driver the lease is in)."""
    return common.AppLease(name, "test", progress=lambda _: None, book=BOOK[0])


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


def test_the_first_driver_to_finish_leaves_the_app_to_the_second(fake):
    """Two drivers (two leases on the one book): the one that started the app ends
    first, the app stays; the other ends, the app goes, though that one never started it."""
    first, second = lease(), lease()
    first.acquire(lambda: fake.start("app"), "m", "here")
    second.acquire(lambda: pytest.fail("must not start"), "m", "here")
    first.release()
    assert fake.apps == {"app"} and fake.calls == [("start", "app")]
    second.release()
    assert fake.calls == [("start", "app"), ("shutdown",)]


def test_a_holder_whose_driver_died_stops_counting(fake):
    """A driver killed while holding the app never releases it: once its beats are older
    than the TTL, the other holder's release stops the app."""
    dead, alive = lease(), lease()
    dead.acquire(lambda: fake.start("app"), "m", "here")
    alive.acquire(lambda: pytest.fail("must not start"), "m", "here")
    fake.now += 30
    fake.book.beat([alive.holder])  # only the live driver's thread beats
    alive.release()
    assert fake.calls == [("start", "app")]  # the dead one is not yet past its TTL
    again = lease()
    again.acquire(lambda: pytest.fail("must not start"), "m", "here")
    fake.now += fake.book.ttl_s + 1
    fake.book.beat([again.holder])
    again.release()
    assert fake.calls == [("start", "app"), ("shutdown",)]


def test_a_second_holder_waits_while_the_first_starts_the_app(fake):
    """One starts, the other waits (it does not start the app a second time), then uses it."""
    starting, release_start = threading.Event(), threading.Event()

    def slow_start():
        starting.set()
        release_start.wait(5)
        fake.start("app")

    first, second = lease(), lease()
    t = threading.Thread(target=first.acquire, args=(slow_start, "m", "here"))
    t.start()
    starting.wait(5)
    lines: list[str] = []
    second.progress = lines.append
    u = threading.Thread(target=second.acquire, args=(lambda: pytest.fail("must not start"), "m", "here"))
    u.start()
    time.sleep(0.3)
    release_start.set()
    t.join(5)
    u.join(5)
    assert fake.calls == [("start", "app")] and any("waiting for another job" in x for x in lines), lines
    assert fake.book.holders("app") == 2


def test_a_failed_start_leaves_the_cluster_as_found(fake):
    a = lease()

    def broken():
        fake.start("app")
        raise RuntimeError("replica failed")

    with pytest.raises(RuntimeError):
        a.acquire(broken, "m", "here")
    assert fake.calls[-1] == ("shutdown",) and fake.book.apps == {}
    b = lease()
    b.acquire(lambda: fake.start("app"), "m", "here")  # the next one starts it afresh
    assert b.started


def test_a_held_lease_beats_and_the_beats_stop_with_the_last_holder():
    from rexeval.serve.leases import Beats

    now = [0.0]
    book = LeaseBook(ttl_s=1.0, clock=lambda: now[0])
    beats = Beats(book, every=0.05)
    holder = beats.new_holder()
    assert book.begin("app", holder, True, True) == "use"
    beats.hold(holder)
    now[0] = 10.0  # long past the TTL: only a beat keeps the holder alive
    deadline = time.monotonic() + 5
    while book.beats[holder] != 10.0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert book.holders("app") == 1
    beats.drop(holder)
    deadline = time.monotonic() + 5
    while beats.thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert beats.thread is None  # no holder, no thread
    beats.hold(holder)  # a new holder starts it again
    assert beats.thread is not None
    beats.drop(holder)
