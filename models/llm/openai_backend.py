"""The `openai` backend: any OpenAI-compatible `/v1/chat/completions` server.

That covers a vLLM server, Ray Serve LLM and hosted APIs (the seeds judged with GPT-4
and Claude). Requests go out in parallel from a thread pool over one pooled httpx client.

Why our own retry loop instead of the `openai` SDK: it is one dependency fewer, and the
policy is ours to state: retry connection errors, timeouts, 429 and 5xx with exponential
backoff plus jitter, honouring `Retry-After`; never retry other 4xx; a malformed body is
an error result. Nothing raises for one request.

Options (`BackendSpec.options`): base_url (required, e.g. http://127.0.0.1:8000/v1),
api_key, or api_key_env (default OPENAI_API_KEY; may be unset for local servers),
served_model (the model name sent to the server; default `spec.model`), concurrency (8),
timeout_s (60), max_retries (4), backoff_s (1.0), max_backoff_s (60), extra_body (dict
merged into every request body).
"""
from __future__ import annotations

import email.utils
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult, register_backend

RETRY_STATUS = {408, 429}  # plus every 5xx


class _Retryable(Exception):
    """A failure worth another try; `wait` is the server's Retry-After, if it sent one."""

    def __init__(self, message: str, wait: float | None = None):
        super().__init__(message)
        self.wait = wait


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def request_body(model: str, request: ChatRequest, extra: dict[str, Any] | None = None) -> dict:
    """The JSON body of one chat completion call."""
    s = request.sampling
    body: dict[str, Any] = {"model": model, "messages": request.messages,
                            "temperature": s.temperature, "top_p": s.top_p,
                            "max_tokens": s.max_tokens, "seed": s.seed}
    if request.json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": request.json_schema, "strict": True}}
    body.update(extra or {})
    return body


def parse_response(data: Any) -> LLMResult:
    """LLMResult from a chat completion body; raises ValueError when it is malformed."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no choices[0].message.content ({type(e).__name__}: {e})") from None
    if not isinstance(text, str):
        raise ValueError(f"choices[0].message.content is {type(text).__name__}, not a string")
    usage = data.get("usage") or {}
    return LLMResult(text=text, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                     completion_tokens=int(usage.get("completion_tokens") or 0),
                     finish_reason=choice.get("finish_reason"))


@register_backend("openai")
class OpenAIBackend(LLMBackend):
    """Chat completions over HTTP, `concurrency` requests in flight at most."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        import httpx

        opts = spec.options
        if not opts.get("base_url"):
            raise ValueError("the openai backend needs options.base_url, "
                             "e.g. http://127.0.0.1:8000/v1")
        self.url = str(opts["base_url"]).rstrip("/") + "/chat/completions"
        self.served_model = opts.get("served_model") or spec.model
        self.concurrency = int(opts.get("concurrency", 8))
        self.max_retries = int(opts.get("max_retries", 4))
        self.backoff_s = float(opts.get("backoff_s", 1.0))
        self.max_backoff_s = float(opts.get("max_backoff_s", 60.0))
        self.extra_body = dict(opts.get("extra_body") or {})
        key = opts.get("api_key") or os.environ.get(opts.get("api_key_env", "OPENAI_API_KEY"))
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            headers=headers, timeout=float(opts.get("timeout_s", 60.0)),
            limits=httpx.Limits(max_connections=self.concurrency,
                                max_keepalive_connections=self.concurrency))
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency,
                                        thread_name_prefix="rexeval-openai")

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        return list(self._pool.map(self._one, requests))

    def _backoff(self, attempt: int, wait: float | None) -> float:
        if wait is not None:
            return min(wait, self.max_backoff_s)
        # Full jitter on an exponential schedule: retries from many threads spread out.
        return min(self.max_backoff_s, self.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0)

    def _one(self, request: ChatRequest) -> LLMResult:
        t0 = time.perf_counter()
        body = request_body(self.served_model, request, self.extra_body)
        attempt = 0
        while True:
            try:
                result = self._call(body)
                return result.model_copy(update={"seconds": time.perf_counter() - t0})
            except _Retryable as e:
                if attempt >= self.max_retries:
                    return LLMResult(error=f"{e} (gave up after {attempt + 1} attempts)",
                                     seconds=time.perf_counter() - t0, transient=True)
                time.sleep(self._backoff(attempt, e.wait))
                attempt += 1
            except Exception as e:  # no retry: 4xx, malformed body, bad request object
                return LLMResult(error=str(e) or type(e).__name__,
                                 seconds=time.perf_counter() - t0)

    def _call(self, body: dict) -> LLMResult:
        """One HTTP attempt: a result, _Retryable, or another exception (final)."""
        import httpx

        try:
            resp = self._client.post(self.url, json=body)
        except httpx.TimeoutException as e:
            raise _Retryable(f"timeout: {type(e).__name__}") from None
        except httpx.TransportError as e:  # connection refused/reset, protocol errors
            raise _Retryable(f"connection error: {type(e).__name__}: {e}") from None
        if resp.status_code in RETRY_STATUS or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:300]}",
                             _retry_after(resp.headers.get("Retry-After")))
        if resp.status_code >= 400:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError:
            raise ValueError(f"malformed response: not JSON: {resp.text[:200]!r}") from None
        try:
            return parse_response(data)
        except ValueError as e:
            raise ValueError(f"malformed response: {e}") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
