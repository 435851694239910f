"""Who holds which Serve application, across every driver of a Ray cluster.

Why: two `ray job submit` drivers (or a study and a job a user submits beside it) may
share one judge or NLI application. A per-process count cannot see the other driver, so
the first to finish deleted the app under the second. The book is kept by one detached
named actor of the cluster (`keeper()`); each `serve.common.AppLease` is a holder in it.

The book's state is in the GCS key-value store, not only in the keeper's memory: the
keeper writes it there after every change and reads it back when it starts. A keeper
that dies (its worker killed, the head pod replaced under GCS fault tolerance) is
restarted by Ray, or made again by the next driver that asks, with the book as it was:
an app that jobs started is still deleted when its last holder ends. Holders read back
get a fresh beat (a clock of the dead process means nothing to the new one): the live
ones go on beating, the dead ones expire one TTL later.

Rules (`LeaseBook`, pure, so it is tested without Ray):
  * an app running before any lease (a standing `rexeval serve` endpoint) is only ever
    used, never deleted;
  * an app a lease started is deleted when its last holder ends, whichever driver that
    is; Serve itself is shut down instead when a lease started Serve too and no other
    leased app is held (a Serve left on one port breaks later starts on other ports);
  * one holder at a time starts an app; the others wait for it, then use it;
  * a holder that stops beating for `ttl_s` (its driver died) no longer counts;
  * a holder's `end` (or `failed`) asked again gets the first answer: a keeper that dies
    mid-call may have done it before its reply was lost, and the driver asks again.
"""
from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

KEEPER_NAME = "rexeval-serve-leases"
KEEPER_NAMESPACE = "rexeval"
STATE_NAMESPACE = "rexeval"  # the GCS key-value namespace of the book's state
TTL_S = 90.0  # a driver that has not beaten for this long is taken for dead
ANSWERS_KEPT = 256  # the last end/failed answers, for a call repeated after a lost reply
BEAT_S = 15.0
CALL_S = 60.0  # a call to the keeper waits this long for it (a restart included)


def _locked(method):
    def run(self, *args):
        with self.lock:
            return method(self, *args)
    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class LeaseBook:
    """The state of every leased app: holders and when each last beat, whether a lease
    started it, who is starting it now."""

    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self.lock = threading.RLock()  # the actor runs one call at a time; threads of a test may not
        self.apps: dict[str, dict[str, Any]] = {}
        self.beats: dict[str, float] = {}
        self.serve_started = False  # a lease started Serve itself
        self.answers: dict[str, str] = {}  # holder -> its end/failed answer (oldest first)

    def _answer(self, holder: str, verdict: str) -> str:
        self.answers[holder] = verdict
        while len(self.answers) > ANSWERS_KEPT:
            del self.answers[next(iter(self.answers))]
        return verdict

    def _alive(self, holder: str) -> bool:
        return self.clock() - self.beats.get(holder, float("-inf")) <= self.ttl_s

    def _prune(self, name: str, running: bool) -> dict[str, Any] | None:
        """The app's record with dead holders dropped; None (and forgotten) when it holds
        nothing, or when the app is gone although nobody is starting it."""
        rec = self.apps.get(name)
        if rec is None:
            return None
        rec["holders"] = {h for h in rec["holders"] if self._alive(h)}
        if rec["starting"] is not None and not self._alive(rec["starting"]):
            rec["starting"] = None
        if (not running and rec["starting"] is None) or (not rec["holders"] and rec["starting"] is None):
            del self.apps[name]
            return None
        return rec

    @_locked
    def beat(self, holders: list[str]) -> None:
        now = self.clock()
        for h in holders:
            self.beats[h] = now
        # Holders of drivers that died never end: forget them once past the TTL, so the
        # book of a long-lived cluster does not grow with every crashed driver.
        for h in [h for h, t in self.beats.items() if now - t > self.ttl_s]:
            del self.beats[h]

    @_locked
    def begin(self, name: str, holder: str, running: bool, serve_up: bool) -> str:
        """"use" (the app runs: the holder is counted), "start" (the holder must start it,
        then call `started` or `failed`) or "wait" (another holder is starting it)."""
        self.beat([holder])
        self.answers.pop(holder, None)  # a new lease round of this holder
        if not serve_up and not any(r["starting"] for r in self.apps.values()):
            self.serve_started = False
        rec = self._prune(name, running)
        if rec is not None and rec["starting"] not in (None, holder):
            return "wait"
        if running:
            if rec is None:
                rec = self.apps[name] = {"holders": set(), "started": False, "starting": None}
            rec["holders"].add(holder)
            return "use"
        self.apps[name] = {"holders": set(), "started": False, "starting": holder,
                           "starts_serve": not serve_up}
        return "start"

    @_locked
    def started(self, name: str, holder: str) -> None:
        rec = self.apps[name]
        rec.update(starting=None, started=True)
        rec["holders"].add(holder)
        self.serve_started = self.serve_started or rec.pop("starts_serve", False)

    @_locked
    def failed(self, name: str, holder: str) -> str:
        """The start failed: "shutdown" when this start had brought Serve up and nothing
        else is leased (leave the cluster as found), else "none"."""
        if holder in self.answers:
            return self.answers[holder]
        rec = self.apps.pop(name, None)
        starts_serve = bool(rec and rec.get("starts_serve"))
        return self._answer(holder, "shutdown" if starts_serve and not self._held() else "none")

    def _held(self) -> bool:
        """Whether any app is held or being started by a live holder."""
        return any(self._prune(n, True) is not None for n in list(self.apps))

    @_locked
    def end(self, name: str, holder: str, running: bool) -> str:
        """The holder is done: "keep" (others hold it, or a lease did not start it),
        "delete" (the last holder of an app a lease started) or "shutdown" (that, and a
        lease started Serve, and nothing else is leased)."""
        if holder in self.answers:
            return self.answers[holder]
        return self._answer(holder, self._end(name, holder, running))

    def _end(self, name: str, holder: str, running: bool) -> str:
        self.beats.pop(holder, None)
        rec = self.apps.get(name)
        if rec is None:
            return "keep"
        rec["holders"].discard(holder)
        started = rec["started"]
        if self._prune(name, running) is not None:
            return "keep"
        if not started or not running:
            return "keep"
        if self.serve_started and not self._held():
            self.serve_started = False
            return "shutdown"
        return "delete"

    @_locked
    def holders(self, name: str) -> int:
        rec = self._prune(name, True)
        return len(rec["holders"]) if rec else 0

    @_locked
    def dump(self) -> str:
        """What outlives this process: the apps' records and whether a lease started
        Serve (not the beats, whose clock is this process's)."""
        apps = {name: {**rec, "holders": sorted(rec["holders"])} for name, rec in sorted(self.apps.items())}
        return json.dumps({"apps": apps, "serve_started": self.serve_started,
                           "answers": [[h, v] for h, v in self.answers.items()]}, sort_keys=True)

    @_locked
    def load(self, state: str | bytes | None) -> None:
        """Take over a `dump()`; every holder in it (starters too) counts as just beaten."""
        data = json.loads(state) if state else {}
        self.apps = {name: {**rec, "holders": set(rec["holders"])} for name, rec in data.get("apps", {}).items()}
        self.serve_started = bool(data.get("serve_started", False))
        self.answers = {h: v for h, v in data.get("answers", [])}
        now = self.clock()
        self.beats = {h: now for rec in self.apps.values() for h in [*rec["holders"], rec["starting"]] if h}


class _Keeper:
    """The book as a detached actor (one per cluster, found by name), its state saved to
    the GCS key-value store under `key` after every change and read back at start."""

    def __init__(self, key: str):
        from ray.experimental.internal_kv import _internal_kv_get

        self.key = key
        self.book = LeaseBook()
        self.book.load(_internal_kv_get(key, namespace=STATE_NAMESPACE))
        self.saved = self.book.dump()

    def call(self, method: str, *args):
        from ray.experimental.internal_kv import _internal_kv_put

        try:
            return getattr(self.book, method)(*args)
        finally:
            state = self.book.dump()
            if state != self.saved:
                _internal_kv_put(self.key, state, overwrite=True, namespace=STATE_NAMESPACE)
                self.saved = state


def state_key(name: str) -> str:
    """The key-value store key of the book kept by the keeper called `name`."""
    return f"serve-leases/{name}"


_KEEPER: dict[str, Any] = {}
_KEEPER_LOCK = threading.Lock()


def keeper(name: str = KEEPER_NAME):
    """The cluster's lease keeper (a detached actor of no CPU on the head node, which the
    autoscaler never takes away), started by whichever driver asks first."""
    import ray

    with _KEEPER_LOCK:
        if name not in _KEEPER:
            cls = ray.remote(num_cpus=0, max_restarts=-1, resources={"node:__internal_head__": 0.001})(_Keeper)
            _KEEPER[name] = cls.options(name=name, namespace=KEEPER_NAMESPACE, lifetime="detached",
                                        get_if_exists=True).remote(state_key(name))
        return _KEEPER[name]


class RayBook:
    """`LeaseBook`'s methods, called on the cluster's keeper (`name`: another book, for tests)."""

    def __init__(self, name: str = KEEPER_NAME):
        self.name = name

    def __getattr__(self, method: str):
        import ray

        def call(*args):
            if not ray.is_initialized():
                # This process has left Ray (a driver shutting down): calling now would
                # start or join a Ray of its own through Ray's auto-init.
                raise ConnectionError(f"lease book: no Ray connection for {method}")
            deadline = time.monotonic() + CALL_S
            while True:
                try:
                    return ray.get(keeper(self.name).call.remote(method, *args), timeout=CALL_S)
                except (ray.exceptions.RayActorError, ray.exceptions.RaySystemError) as exc:
                    # Restarting (ActorUnavailableError): the same handle answers soon. Dead, or
                    # a handle from an earlier Ray session: find or make the keeper again. The
                    # book's methods may run twice: a repeat changes nothing.
                    if not isinstance(exc, ray.exceptions.ActorUnavailableError):
                        with _KEEPER_LOCK:
                            _KEEPER.pop(self.name, None)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        return call


class Beats:
    """This process's holders, beaten every `BEAT_S` by one daemon thread while any is
    held, so that the book can tell a live driver from a dead one."""

    def __init__(self, book, every: float = BEAT_S):
        self.book, self.every = book, every
        self.holders: set[str] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()

    def new_holder(self) -> str:
        return f"{uuid.uuid4().hex[:12]}"

    def hold(self, holder: str) -> None:
        with self.lock:
            self.holders.add(holder)
            if self.thread is None or self.pid != os.getpid():  # none yet, or this is a forked child
                self.pid = os.getpid()
                self.thread = threading.Thread(target=self._run, name="rexeval-lease-beats", daemon=True)
                self.thread.start()

    def drop(self, holder: str) -> None:
        with self.lock:
            self.holders.discard(holder)

    def _run(self) -> None:
        while True:
            time.sleep(self.every)
            with self.lock:
                held = sorted(self.holders)
                if not held:  # decided under the lock: a holder added now starts a new thread
                    self.thread = None
                    return
            try:
                self.book.beat(held)
            except Exception:  # noqa: BLE001  (a missed beat is retried; the TTL is several beats)
                pass
