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
    from ray import serve  # what common's functions import when they run

    monkeypatch.setattr(serve, "delete", f.delete)
    monkeypatch.setattr(serve, "shutdown", f.shutdown)
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


# -- a job's own app on GPUs scales to zero when idle -------------------------------------


def serve_autoscaling(app) -> dict:
    """The autoscaling config Serve deploys for a built application's deployment."""
    return app._bound_deployment._deployment_config.autoscaling_config.model_dump(
        include={"min_replicas", "initial_replicas", "max_replicas"})


def test_a_jobs_own_app_on_gpus_starts_with_a_replica_and_may_fall_to_zero():
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge import JudgeServeConfig, judge_app

    spec = BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model="scripted-judge")
    gpu = JudgeServeConfig(backend=spec, num_gpus=1, max_replicas=4)
    idle = common.idle_to_zero(gpu)
    assert serve_autoscaling(judge_app(idle)) == {"min_replicas": 0, "initial_replicas": 1, "max_replicas": 4}
    assert judge_app(idle)._bound_deployment.ray_actor_options["num_gpus"] == 1
    assert serve_autoscaling(judge_app(gpu))["min_replicas"] == 1  # a standing endpoint keeps its floor
    two = common.idle_to_zero(gpu.model_copy(update={"min_replicas": 2}))
    assert (two.min_replicas, two.initial_replicas) == (0, 2)
    cpu = JudgeServeConfig(backend=spec, max_replicas=4)
    assert common.idle_to_zero(cpu) is cpu  # CPUs only: nothing to give back


def test_the_judge_a_job_starts_on_a_gpu_may_fall_to_zero(monkeypatch):
    """`JudgeService` (what judge jobs and study steps start) deploys the idle-to-zero
    settings; the config the job hashes (which app it joins) stays the job's own."""
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve import judge_client
    from rexeval.serve.judge import JudgeServeConfig

    started = []
    monkeypatch.setattr(judge_client, "start_judge_service", lambda cfg, **kw: started.append(cfg))
    monkeypatch.setattr(common, "running_apps", lambda: set())
    monkeypatch.setattr(common, "serve_running", lambda: True)
    cfg = JudgeServeConfig(backend=BackendSpec(backend="hf", model="m"), num_gpus=1, max_replicas=2)
    svc = judge_client.JudgeService(cfg, progress=lambda _: None)
    svc.lease = common.AppLease(svc.app_name, "judge", progress=lambda _: None, book=LeaseBook())
    assert svc.address() == f"serve:{svc.app_name}"
    [deployed] = started
    assert (deployed.min_replicas, deployed.initial_replicas, deployed.max_replicas) == (0, 1, 2)
    assert svc.cfg == cfg and cfg.min_replicas == 1


def test_a_jobs_vllm_engines_may_fall_to_zero(tmp_path):
    from rexeval.models.llm.base import BackendSpec
    from rexeval.serve.judge_vllm import llm_config_args

    args = llm_config_args(BackendSpec(backend="vllm", model=str(tmp_path)), min_replicas=0, max_replicas=3,
                           initial_replicas=2)
    assert args["deployment_config"]["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 3,
                                                               "initial_replicas": 2}
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**args["deployment_config"]["autoscaling_config"])  # Serve takes it


def test_the_default_serve_port_is_8000_or_the_environments(monkeypatch):
    """Every job and command that starts Serve without a port takes $REXEVAL_SERVE_PORT
    (a host whose 8000 is taken, two clusters on one machine); a bad value is refused
    with the variable's name, not passed on to Serve."""
    from rexeval.pipelines.core.llm.job import ChunkedLLMSettings
    from rexeval.pipelines.evaluate.config import EvaluateConfig

    monkeypatch.delenv(common.SERVE_PORT_ENV, raising=False)
    assert common.default_serve_port() == 8000
    monkeypatch.setenv(common.SERVE_PORT_ENV, " 8123 ")
    assert common.default_serve_port() == 8123
    assert ChunkedLLMSettings(out="y").serve_port == 8123
    assert EvaluateConfig(explanations=["x"], out="y").serve_port == 8123
    assert EvaluateConfig(explanations=["x"], out="y", serve_port=9000).serve_port == 9000
    for bad in ("http", "0", "70000"):
        monkeypatch.setenv(common.SERVE_PORT_ENV, bad)
        with pytest.raises(ValueError, match=common.SERVE_PORT_ENV):
            common.default_serve_port()


def test_the_test_workers_serve_port_is_outside_the_ports_others_are_handed(tmp_path):
    """The session's Serve port lies between the local clusters' block and the kernel's
    ephemeral range (an outgoing connection took it once in CI, and a study's Serve failed
    to bind); a port taken now is skipped; an empty gap falls back to any free port."""
    import socket

    from tests.doubles import ports

    range_file = tmp_path / "range"
    range_file.write_text("32768\t60999\n")
    assert ports.ephemeral_low(str(range_file)) == 32768
    assert ports.ephemeral_low(str(tmp_path / "absent")) == 32768
    for _ in range(20):
        assert ports.CLUSTER_PORT_HIGH <= ports.session_port() < ports.ephemeral_low()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        assert ports.session_port(low=taken, high=taken + 1, tries=5) != taken  # falls back
    assert ports.session_port(low=40000, high=40000) > 0
