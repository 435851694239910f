"""A scripted LLM backend for tests: answers chosen by rules, no model.

Rules are (substring, answer) pairs matched in order against the request's last user
message (for a retry that is our feedback message, so a test can script "bad answer
first, good answer after the feedback"). Special answers:
  "!raise"  the whole generate() call raises (a crashing backend)
  "!error"  that request gets an error result
  "!exit"   the process exits at once (kills a Ray actor mid-job), only while the
            file named by the `exit_flag` option exists (with `exit_once`, the exit
            removes that file first: one kill, then the restarted process answers "[]")
Option `delay_s` makes each generate() call slow (to kill a job mid-way).
Transport faults (results with `transient` set, as a 503 or a dead replica gives):
  `flaky` (0..1)      that fraction of requests fails the first time this process sees it
                      (chosen by a hash of the request, so the same ones in every run)
  `down_while` PATH + `down_for` TEXT: a request whose last user message holds TEXT
                      fails every time while the file PATH exists
  `hang_while` PATH + `hang_for` TEXT: a call holding a request whose last user message
                      holds TEXT sleeps `hang_s` (30) first while the file PATH exists
                      (a caller's timeout then fires: a Serve or HTTP timeout)
Every request is appended to the file named by the `log` option (one JSON line), so
tests count calls across Ray worker processes; with the `starts` option each
construction (a model load: an engine start) appends a line to that file.

Usable in-process (`ScriptedLLM.make(...)`) or through the real pipeline with
`backend="tests.doubles.llm:ScriptedLLM"` and the rules in `backend_options`.
"""
from __future__ import annotations

import json
import os

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult


class ScriptedLLM(LLMBackend):
    name = "scripted"

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        self.rules = [tuple(r) for r in spec.options.get("rules", [])]
        self.default = spec.options.get("default", "[]")
        self.log = spec.options.get("log")
        self.exit_flag = spec.options.get("exit_flag")
        self.exit_once = bool(spec.options.get("exit_once", False))
        self.delay_s = float(spec.options.get("delay_s", 0))
        self.flaky = float(spec.options.get("flaky", 0))
        self.down_while, self.down_for = spec.options.get("down_while"), spec.options.get("down_for")
        self.hang_while, self.hang_for = spec.options.get("hang_while"), spec.options.get("hang_for")
        self.hang_s = float(spec.options.get("hang_s", 30))
        self._seen: set[str] = set()
        self.calls: list[ChatRequest] = []
        if spec.options.get("starts"):
            with open(spec.options["starts"], "a") as fh:
                fh.write(f"{os.getpid()}\n")

    @classmethod
    def make(cls, rules=(), default="[]", model="scripted-model", **options) -> "ScriptedLLM":
        return cls(BackendSpec(backend="tests.doubles.llm:ScriptedLLM", model=model,
                               options={"rules": [list(r) for r in rules], "default": default,
                                        **options}))

    def _answer(self, req: ChatRequest) -> str:
        last = next(m["content"] for m in reversed(req.messages) if m["role"] == "user")
        for needle, answer in self.rules:
            if needle in last:
                return answer
        return self.default

    def _fault(self, req: ChatRequest) -> str | None:
        import hashlib

        last = next(m["content"] for m in reversed(req.messages) if m["role"] == "user")
        if self.down_while and self.down_for and self.down_for in last and os.path.exists(self.down_while):
            return "scripted outage: HTTP 503"
        if self.flaky:
            key = req.model_dump_json()
            share = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
            if share < self.flaky and key not in self._seen:
                self._seen.add(key)
                return "scripted flake: connection reset"
        return None

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        answers = [self._answer(r) for r in requests]
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
        if self.hang_while and os.path.exists(self.hang_while) and any(
                self.hang_for in r.messages[-1]["content"] for r in requests):
            import time

            time.sleep(self.hang_s)
        if self.log:
            with open(self.log, "a") as fh:
                for r, a in zip(requests, answers):
                    fh.write(json.dumps({"last": r.messages[-1]["content"][-200:], "answer": a[:40],
                                         "schema": r.json_schema is not None}) + "\n")
        self.calls.extend(requests)
        if "!raise" in answers:
            raise RuntimeError("scripted backend failure")
        if "!exit" in answers and self.exit_flag and os.path.exists(self.exit_flag):
            if self.exit_once:
                os.remove(self.exit_flag)
            os._exit(1)
        out = []
        for r, a in zip(requests, answers):
            fault = self._fault(r)
            if fault:
                out.append(LLMResult(error=fault, transient=True))
            elif a == "!error":
                out.append(LLMResult(error="scripted request failure"))
            elif a == "!exit":
                out.append(LLMResult(text="[]", prompt_tokens=10, completion_tokens=1))
            else:
                out.append(LLMResult(text=a, prompt_tokens=100, completion_tokens=len(a.split()),
                                     finish_reason="stop"))
        return out
