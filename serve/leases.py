"""Who holds which Serve application, across every driver of a Ray cluster.

Why: two `ray job submit` drivers (or a study and a job a user submits beside it) may
share one judge or NLI application. A per-process count cannot see the other driver, so
the first to finish deleted the app under the second. The book lives in one detached
named actor of the cluster (`keeper()`); each `serve.common.AppLease` is a holder in it.

Rules (`LeaseBook`, pure, so it is tested without Ray):
  * an app running before any lease (a standing `rexeval serve` endpoint) is only ever
    used, never deleted;
  * an app a lease started is deleted when its last holder ends, whichever driver that
    is; Serve itself is shut down instead when a lease started Serve too and no other
    leased app is held (a Serve left on one port breaks later starts on other ports);
  * one holder at a time starts an app; the others wait for it, then use it;
  * a holder that stops beating for `ttl_s` (its driver died) no longer counts.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

KEEPER_NAME = "rexeval-serve-leases"
KEEPER_NAMESPACE = "rexeval"
TTL_S = 90.0  # a driver that has not beaten for this long is taken for dead
BEAT_S = 15.0


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
        rec = self.apps.pop(name, None)
        starts_serve = bool(rec and rec.get("starts_serve"))
        return "shutdown" if starts_serve and not self._held() else "none"

    def _held(self) -> bool:
        """Whether any app is held or being started by a live holder."""
        return any(self._prune(n, True) is not None for n in list(self.apps))

    @_locked
    def end(self, name: str, holder: str, running: bool) -> str:
        """The holder is done: "keep" (others hold it, or a lease did not start it),
        "delete" (the last holder of an app a lease started) or "shutdown" (that, and a
        lease started Serve, and nothing else is leased)."""
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


class _Keeper:
    """The book as a detached actor (one per cluster, found by name)."""

    def __init__(self):
        self.book = LeaseBook()

    def call(self, method: str, *args):
        return getattr(self.book, method)(*args)


_KEEPER: list[Any] = []
_KEEPER_LOCK = threading.Lock()


def keeper():
    """The cluster's lease keeper (a detached actor of no CPU on the head node, which the
    autoscaler never takes away), started by whichever driver asks first."""
    import ray

    with _KEEPER_LOCK:
        if not _KEEPER:
            cls = ray.remote(num_cpus=0, max_restarts=-1, resources={"node:__internal_head__": 0.001})(_Keeper)
            _KEEPER.append(cls.options(name=KEEPER_NAME, namespace=KEEPER_NAMESPACE, lifetime="detached",
                                       get_if_exists=True).remote())
        return _KEEPER[0]


class RayBook:
    """`LeaseBook`'s methods, called on the cluster's keeper."""

    def __getattr__(self, method: str):
        import ray

        def call(*args):
            if not ray.is_initialized():
                # This process has left Ray (a driver shutting down): calling now would
                # start or join a Ray of its own through Ray's auto-init.
                raise ConnectionError(f"lease book: no Ray connection for {method}")
            try:
                return ray.get(keeper().call.remote(method, *args), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.RaySystemError):
                _KEEPER.clear()  # a handle from an earlier Ray session, or a keeper since restarted
                return ray.get(keeper().call.remote(method, *args), timeout=60)
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
