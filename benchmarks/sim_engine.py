"""A simulated vLLM engine as a Ray Serve deployment, and the driver of one arm of
`bench_llm_scale.py` (which says what the benchmark measures and how to run it).

The engine (`SimEngine`, one replica = one GPU's engine, holding 0 CPU) behaves like a
vLLM server, in wall-clock time but with sleeps instead of a GPU, so the machine's CPUs
stay free for the orchestration under test:

- a load: each (re)start sleeps `load_s` (weights, CUDA graphs) before it answers;
- continuous batching: up to `max_num_seqs` sequences run at once; a new request joins
  the running batch at the next step, a finished one leaves it at once;
- steps: each step decodes one token of every running sequence and prefills newly
  admitted prompts (chunked: at most `max_batched_tokens` tokens per step); it takes
  `step_base_s + step_decode_s * decode tokens + step_prefill_s * prefill tokens`;
- prefix caching (vLLM's automatic prefix caching): the leading messages a replica has
  already seen (the prompt's instructions and few-shot examples) are not prefilled again;
- answers of realistic length (the JSON a STAR prompt asks for, 3-7 statements of
  candidates, most of them kept by the verifier; a token is `chars_per_token` characters);
- a planted share (`malformed_share`, chosen by a hash of the request) of first answers
  cut off before their JSON closes, which the job's parser rejects, so the job sends a
  repair turn; a repair is always answered well.

Engine work, the ideal's numerator: a request's work is what it costs an engine whose
batch is full: `completion_tokens * (step_base_s / max_num_seqs + step_decode_s) +
prefill_tokens * step_prefill_s` (a full decode step's time shared by its
`max_num_seqs` tokens, and the prefill the request needed). Each replica sums it over
the requests it served and reports it to the `EngineLedger` actor, with its starts.

The driver part (`drive`) runs in its own process with its own local Ray: it starts the
ledger and the engines (a Serve app of N replicas), runs `rexeval extract` (STAR, both
turns) against them, samples its own RSS and the object store, and writes what it saw.
For the pass design (`arm == "passes"`) it wraps that design's per-pass call
(`llm_stream._call_keeping_rows`) so that each call after the first starts the engines
again (`deploy` with a new generation): `bench_llm_scale.py` says why.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

LEDGER = "rexeval-sim-ledger"
NAMESPACE = "rexeval-sim"
APP = "rexeval-sim"
DEPLOYMENT = "SimEngine"
MODEL_ID = "sim-llama-8b"
REPAIR_MARK = "Your previous answer could not be used"  # prompts/retry_feedback.yaml
LIMITS = {"max_body_bytes": 8_000_000, "max_requests": 256, "max_messages": 64, "max_chars": 32_000,
          "max_tokens": 8192}  # serve/judge.py JudgeLimits' defaults (the new stream's client reads them)


@dataclass(frozen=True)
class EngineModel:
    """One simulated engine's timing (see the module docstring)."""

    load_s: float = 30.0
    max_num_seqs: int = 128
    step_base_s: float = 0.008
    step_decode_s: float = 0.00024
    step_prefill_s: float = 0.00004
    max_batched_tokens: int = 8192
    malformed_share: float = 0.10
    chars_per_token: float = 4.0

    def tokens(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.chars_per_token))

    @property
    def full_step_s(self) -> float:
        return self.step_base_s + self.step_decode_s * self.max_num_seqs

    @property
    def tokens_per_s_full_batch(self) -> float:
        """Output tokens per second with every sequence slot decoding."""
        return self.max_num_seqs / self.full_step_s

    def work_s(self, completion_tokens: int, prefill_tokens: int) -> float:
        """Engine seconds a request costs at a full batch (the ideal's unit)."""
        return (completion_tokens * (self.step_base_s / self.max_num_seqs + self.step_decode_s)
                + prefill_tokens * self.step_prefill_s)

    def describe(self) -> dict:
        return {**asdict(self),
                "step_time": "step_base_s + step_decode_s * decode_tokens + step_prefill_s * prefill_tokens "
                             "(prefill chunked at max_batched_tokens per step)",
                "full_step_s": round(self.full_step_s, 5),
                "tokens_per_s_full_batch": round(self.tokens_per_s_full_batch, 1),
                "prefill_tokens_per_s": round(1 / self.step_prefill_s, 1)}


# -- answers ---------------------------------------------------------------------------

PARTS = ["strings", "neck", "fretboard", "tuning pegs", "pickup", "bridge", "case", "strap", "cable",
         "knobs", "body", "finish", "battery", "pedal", "amp", "headphone jack", "mouthpiece", "reed",
         "drum head", "stand", "clip", "tuner display", "power supply", "keys", "bow"]
TRAITS = [("stays in tune for weeks of daily practice", "positive"),
          ("feels smooth and even under the fingers", "positive"),
          ("gives a warm and full tone at low volume", "positive"),
          ("arrives with a crack along one edge", "negative"),
          ("buzzes on the lower frets after a month", "negative"),
          ("comes loose when the instrument is moved", "negative"),
          ("is lighter than it looks in the photos", "neutral"),
          ("ships with a short printed manual", "neutral"),
          ("holds its setting through a long rehearsal", "positive"),
          ("picks up a hum near other electronics", "negative"),
          ("is easy to adjust without any tools", "positive"),
          ("has a finish that scratches easily", "negative")]


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def candidates_answer(review_message: str) -> str:
    """The candidate statements a model would pull out of one review (3-7 of them)."""
    h = _h(review_message)
    n = 3 + h % 5
    items = []
    for k in range(n):
        part = PARTS[(h >> (4 * k)) % len(PARTS)]
        trait, sentiment = TRAITS[(h >> (4 * k + 2)) % len(TRAITS)]
        items.append({"statement": f"the product's {part} {trait}", "sentiment": sentiment})
    return json.dumps({"statements": items})


def verified_answer(statements_message: str) -> str:
    """The verifier's answer: the candidates it was shown, about 4 in 5 of them kept."""
    start = statements_message.find('{"statements"')
    try:
        shown = json.JSONDecoder().raw_decode(statements_message, start)[0]["statements"] if start >= 0 else []
    except (ValueError, KeyError, TypeError):
        shown = []
    kept = [s for s in shown if _h(s.get("statement", "")) % 5] or shown[:1]
    return json.dumps({"statements": [{"statement": s.get("statement", "the product works"),
                                       "sentiment": s.get("sentiment", "neutral")} for s in kept]})


def answer_for(messages: list[dict], malformed_share: float) -> tuple[str, bool]:
    """(answer text, malformed?) for one chat request, deterministic in its messages."""
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    repair = last.startswith(REPAIR_MARK)
    task = next((u for u in reversed(users) if not u.startswith(REPAIR_MARK)), "")
    good = verified_answer(task) if "Statements to clean" in task else candidates_answer(task)
    if not repair and (_h("malformed" + task) % 10_000) < malformed_share * 10_000:
        return "Here is the JSON you asked for: " + good[: max(20, int(len(good) * 0.55))], True
    return good, False


# -- the engine (a Serve replica) ----------------------------------------------------------


class _Seq:
    __slots__ = ("fut", "prefill", "decode", "result")

    def __init__(self, fut, prefill: int, decode: int, result: dict):
        self.fut, self.prefill, self.decode, self.result = fut, prefill, decode, result


class SimEngine:
    """One simulated engine (see the module docstring). Methods: `generate` (the handle
    API of serve/judge.py: [ChatRequest dict] -> [LLMResult dict]), `chat` (the
    streaming method ray.data.llm's ServeDeploymentProcessor calls), `info`."""

    def __init__(self, model: dict):
        self.m = EngineModel(**model)
        self.generation = None
        self.loaded = None  # an asyncio.Event, made on the replica's loop
        self.waiting: deque = deque()
        self.active: list[_Seq] = []
        self.wake = None
        self.loop_task = None
        self.prefixes: set[int] = set()
        self.totals = {"requests": 0, "completion_tokens": 0, "prefill_tokens": 0, "prompt_tokens": 0,
                       "work_s": 0.0, "busy_s": 0.0, "steps": 0, "malformed": 0, "repairs": 0,
                       "largest_batch": 0}
        self.key = f"{os.getpid()}-{id(self)}"
        self.ledger = None
        self.last_push = 0.0

    async def reconfigure(self, user_config: dict) -> None:
        """A (re)start of the engine: a new generation loads again and forgets its cache."""
        import ray

        if self.loaded is None:
            self.loaded, self.wake = asyncio.Event(), asyncio.Event()
        self.loaded.clear()
        await asyncio.sleep(self.m.load_s)
        self.generation = user_config.get("generation", 0)
        self.prefixes.clear()
        if self.ledger is None:
            self.ledger = ray.get_actor(LEDGER, namespace=NAMESPACE)
        self.ledger.started.remote(self.generation, self.key)
        if self.loop_task is None:
            self.loop_task = asyncio.get_running_loop().create_task(self._run())
        self.loaded.set()

    def _prefill_tokens(self, messages: list[dict]) -> int:
        """Tokens of the messages after the longest prefix this engine has cached."""
        h, cached_upto, hashes = 0, 0, []
        for i, m in enumerate(messages):
            h = hash((h, m.get("role"), m.get("content")))
            hashes.append(h)
            if h in self.prefixes:
                cached_upto = i + 1
        if len(self.prefixes) > 500_000:
            self.prefixes.clear()
        self.prefixes.update(hashes)
        return sum(self.m.tokens(m.get("content", "")) for m in messages[cached_upto:]) or 1

    async def _one(self, request: dict) -> dict:
        if not self.loaded.is_set():
            await self.loaded.wait()
        messages = request.get("messages") or []
        text, malformed = answer_for(messages, self.m.malformed_share)
        prompt = sum(self.m.tokens(m.get("content", "")) for m in messages)
        prefill = self._prefill_tokens(messages)
        out = self.m.tokens(text)
        t = self.totals
        t["requests"] += 1
        t["completion_tokens"] += out
        t["prefill_tokens"] += prefill
        t["prompt_tokens"] += prompt
        t["work_s"] += self.m.work_s(out, prefill)
        t["malformed"] += int(malformed)
        t["repairs"] += int(any(m.get("content", "").startswith(REPAIR_MARK) for m in messages[-1:]))
        t0 = time.perf_counter()
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(_Seq(fut, prefill, out, {"text": text, "prompt_tokens": prompt,
                                                     "completion_tokens": out, "finish_reason": "stop"}))
        self.wake.set()
        result = await fut
        result["seconds"] = round(time.perf_counter() - t0, 4)
        return result

    async def _run(self) -> None:
        """The step loop: continuous batching in simulated engine time. Engine time runs
        on from the last step's end while the engine is busy, so a late wake-up of this
        process (a busy CPU) does not slow the simulated GPU down (at most 1 s is caught up)."""
        m = self.m
        clock = None
        while True:
            if not self.active and not self.waiting:
                self._push(force=True)
                self.wake.clear()
                await self.wake.wait()
                clock = None
            while self.waiting and len(self.active) < m.max_num_seqs:
                self.active.append(self.waiting.popleft())
            self.totals["largest_batch"] = max(self.totals["largest_batch"], len(self.active))
            decoding = [s for s in self.active if s.prefill == 0]
            budget = m.max_batched_tokens - len(decoding)
            prefilled = 0
            for s in self.active:
                if budget <= 0:
                    break
                if s.prefill:
                    take = min(s.prefill, budget)
                    s.prefill -= take
                    budget -= take
                    prefilled += take
            dt = m.step_base_s + m.step_decode_s * len(decoding) + m.step_prefill_s * prefilled
            now = time.perf_counter()
            start = now if clock is None or clock < now - 1.0 else clock
            clock = start + dt
            delay = clock - time.perf_counter()
            await asyncio.sleep(delay if delay > 0 else 0)
            self.totals["busy_s"] += dt
            self.totals["steps"] += 1
            done = []
            for s in decoding:
                s.decode -= 1
                if s.decode <= 0:
                    done.append(s)
            if done:
                gone = set(map(id, done))
                self.active = [s for s in self.active if id(s) not in gone]
                for s in done:
                    if not s.fut.done():
                        s.fut.set_result(s.result)
            self._push()

    def _push(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.ledger is not None and (force or now - self.last_push > 1.0):
            self.last_push = now
            self.ledger.report.remote(self.key, dict(self.totals))

    async def generate(self, requests: list) -> list[dict]:
        return list(await asyncio.gather(*(self._one(r if isinstance(r, dict) else r.model_dump())
                                           for r in requests)))

    async def chat(self, request: dict):
        raw = request.get("request_json")
        result = await self._one(json.loads(raw) if raw else request.get("request"))
        yield {"result": json.dumps(result)}

    async def info(self) -> dict:
        return {"model_id": MODEL_ID, "backend": "sim", "limits": LIMITS, "max_batch_requests": 256,
                "generation": self.generation, "requests_served": self.totals["requests"]}


class EngineLedger:
    """Counts engine starts (replica, generation) and sums the replicas' totals."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.starts: list[tuple[int, str]] = []
        self.totals: dict[str, dict] = {}

    def started(self, generation: int, replica: str) -> None:
        self.starts.append((generation, replica))

    def report(self, replica: str, totals: dict) -> None:
        self.totals[replica] = totals

    def summary(self) -> dict:
        keys = set().union(*self.totals.values()) if self.totals else set()
        summed = {k: sum(t.get(k, 0) for t in self.totals.values()) for k in keys if k != "largest_batch"}
        summed["largest_batch"] = max((t.get("largest_batch", 0) for t in self.totals.values()), default=0)
        return {"replica_starts": len(self.starts), "group_starts": len({g for g, _ in self.starts}),
                "replicas": len(self.totals), **summed}


def deploy(engines: int, model: EngineModel, generation: int) -> float:
    """Start (generation 0) or restart (a later generation: the engines are stopped and N
    new ones start at once, each loading again, as a new vLLM engine pool would) the N
    engines; returns the seconds it took (back when all of them answer)."""
    from ray import serve

    dep = serve.deployment(SimEngine, name=DEPLOYMENT, num_replicas=engines, max_ongoing_requests=4096,
                           max_queued_requests=-1, ray_actor_options={"num_cpus": 0},
                           user_config={"generation": generation}, graceful_shutdown_timeout_s=1,
                           graceful_shutdown_wait_loop_s=0.5, health_check_period_s=10,
                           logging_config={"enable_access_log": False})
    t0 = time.perf_counter()
    if generation:
        serve.delete(APP)
    serve.run(dep.bind(asdict(model)), name=APP, route_prefix=None)
    return time.perf_counter() - t0


# -- the arm's driver ------------------------------------------------------------------------


class Sampler:
    """The driver's RSS and the object store's use, sampled every `every_s` in a thread."""

    def __init__(self, every_s: float = 0.5):
        import psutil

        self.every_s = every_s
        self.proc = psutil.Process()
        self.peak_rss = self.proc.memory_info().rss
        self.peak_store = 0
        self.peak_spilled = 0
        self.samples = 0
        self._stop = threading.Event()
        self._state = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _store(self) -> tuple[int, int]:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        if self._state is None:
            import ray

            self._state = get_state_from_address(ray.get_runtime_context().gcs_address)
        s = get_memory_info_reply(self._state, timeout_seconds=10).store_stats
        return int(s.object_store_bytes_used), int(s.spilled_bytes_total)

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        try:
            used, spilled = self._store()
            self.peak_store = max(self.peak_store, used)
            self.peak_spilled = max(self.peak_spilled, spilled)
        except Exception:  # noqa: BLE001  (a missed sample: the next one counts)
            pass
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {"driver_peak_mib": round(self.peak_rss / 2**20, 1),
                "object_store_peak_mib": round(self.peak_store / 2**20, 1),
                "spilled_mib": round(self.peak_spilled / 2**20, 1), "samples": self.samples}


def _ledger_settled(ledger, wait_s: float = 20.0) -> dict:
    """The ledger once every replica's last report is in (two equal reads 1.5 s apart)."""
    import ray

    last = ray.get(ledger.summary.remote())
    deadline = time.time() + wait_s
    while time.time() < deadline:
        time.sleep(1.5)
        now = ray.get(ledger.summary.remote())
        if now == last:
            return now
        last = now
    return last


def drive(args: dict) -> None:
    """One arm at one or more sizes, one after the other in this process's Ray (see the
    module docstring); writes each run's JSON to its `result` path. `args`: arm, engines,
    model (EngineModel's fields), input, shard_size, backend_options, cpus, and runs
    (a list of {n, out, result})."""
    import ray
    from ray import serve

    from rexeval.pipelines.core.runtime import init_ray

    init_ray(num_cpus=int(args.get("cpus", 2)))
    serve.start(proxy_location="Disabled")
    ledger = ray.remote(num_cpus=0)(EngineLedger).options(name=LEDGER, namespace=NAMESPACE).remote()
    for run in args["runs"]:
        ray.get(ledger.reset.remote())
        _drive_one({**args, **run}, ledger)
    serve.shutdown()
    ray.shutdown()


def _drive_one(args: dict, ledger) -> None:
    import ray
    from ray import serve

    from rexeval.pipelines.extract.config import ExtractConfig
    from rexeval.pipelines.extract.pipeline import run_extract

    model = EngineModel(**args["model"])
    engines = int(args["engines"])
    restarts: list[float] = []
    passes: list[int] = []
    if args["arm"] == "passes":
        # The pass design (a worktree of the old commit): every processor it builds for a
        # pass starts its engines (the vllm kind's vLLMEngineProcessor did); here each
        # call with rows after the first restarts the engines, which load again.
        # The old commit's module name (pipelines/core/llm_stream.py there), not this
        # checkout's pipelines/core/llm/stream.py: only the pass design runs this.
        from rexeval.pipelines.core import llm_stream

        original = getattr(llm_stream, "_original_call_keeping_rows", llm_stream._call_keeping_rows)
        llm_stream._original_call_keeping_rows = original

        def restarting(part, plan, hosts):
            rows = part.count()
            if rows:
                passes.append(rows)
                if len(passes) > 1:
                    restarts.append(deploy(engines, model, len(passes) - 1))
            return original(part, plan, hosts)

        llm_stream._call_keeping_rows = restarting
    cfg = ExtractConfig(input=args["input"], out=args["out"], method="star", backend="serve",
                        limit=int(args["n"]), models={"embedder": "none"}, use_cache=False,
                        backend_options={"address": f"serve:{APP}", "deployment": DEPLOYMENT,
                                         **args["backend_options"]},
                        shard_size=int(args["shard_size"]), cpus_per_worker=float(args.get("cpus_per_worker", 0.25)))
    lines: list[str] = []

    def progress(line: str) -> None:
        if "shard" not in line or "done" not in line:
            lines.append(line)
            print(line, flush=True)

    load_before = os.getloadavg()[0]
    sampler = Sampler().start()
    t0 = time.perf_counter()
    first_start = deploy(engines, model, 0)
    t1 = time.perf_counter()
    manifest = run_extract(cfg, progress=progress)
    t2 = time.perf_counter()
    mem = sampler.stop()
    ledger_now = _ledger_settled(ledger)
    counts = manifest.get("counts", {})
    result = {"arm": args["arm"], "n": int(args["n"]), "engines": engines, "wall_s": round(t2 - t0, 2),
              "job_s": round(t2 - t1, 2), "first_start_s": round(first_start, 2),
              "restart_s": [round(r, 2) for r in restarts], "calls_per_pass": passes,
              "ledger": ledger_now, "counts": counts, "llm_engines": manifest.get("llm_engines"),
              "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "progress": lines[-12:], **mem}
    open(args["result"], "w").write(json.dumps(result, indent=1))
    serve.delete(APP)
