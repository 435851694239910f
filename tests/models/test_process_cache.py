"""models/process_cache.py: a model is built once per key, however many threads ask."""
import threading
import time

from rexeval.models.process_cache import ProcessCache


def test_each_key_is_built_once_across_threads_and_clear_forgets():
    cache: ProcessCache[object] = ProcessCache()
    built = []

    def build():
        built.append(1)
        time.sleep(0.05)  # long enough for every thread to be waiting on the lock
        return object()

    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("m", build))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(got) == 8 and all(g is got[0] for g in got)
    assert cache.get("other", object) is not got[0] and len(built) == 1
    assert cache.pop("m") is got[0] and cache.pop("m") is None
    cache.clear()
    assert cache.get("other", lambda: "new") == "new"
