"""The judge endpoint in OpenAI's chat-completions shape, so any OpenAI client can call it.

`POST <route>/v1/chat/completions` takes a `ChatCompletionRequest` and answers a
`ChatCompletion`; `GET <route>/v1/models` lists the one served model. The request
becomes one of our `ChatRequest`s, so it joins the deployment's batches with every
other caller's. Pure functions here (tested without Serve); the routing is in judge.py.

What is not supported, answered 400 in OpenAI's error shape rather than ignored:
streaming (`stream: true`: judges read whole answers; a client wanting tokens as they
come should call a vLLM server directly), `n` > 1, tools / function calls, logprobs,
stop sequences, and non-text message parts (images). `model` must be the served
model's id (or "auto"): the call cache and every report name the model that
answered, so a request for another model is answered 404 (`model_not_found`), as
OpenAI and vLLM do. `max_completion_tokens` is read as `max_tokens`; response_format
`json_schema` becomes our constrained decoding, `json_object` a schema of any object.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rexeval.models.llm.base import ChatRequest, LLMResult, SamplingParams
from rexeval.serve.common import RequestError, validation_summary

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat-completions body that the judge honours or refuses;
    others (user, metadata, store, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[OpenAIMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = 1
    stream: bool = False
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    logprobs: bool | None = None
    stop: str | list[str] | None = None


class OpenAIError(RequestError):
    """A refusal in OpenAI's error body: {"error": {"message", "type", "code"}}."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(status, message)
        self.code, self.type = code, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "code": self.code, "param": None}}


def _text(message: OpenAIMessage, i: int) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"messages[{i}]: only text content parts are supported", "unsupported_content")
        parts.append(part["text"])
    return "".join(parts)


def _schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise OpenAIError(400, "response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise OpenAIError(400, f"response_format type {kind!r} is not supported (text, json_object, json_schema)")


def parse_chat_completion(body: bytes, served_model: str, max_body_bytes: int) -> ChatRequest:
    """One OpenAI chat-completions body -> our ChatRequest, or raise OpenAIError."""
    if len(body) > max_body_bytes:
        raise OpenAIError(413, f"body of {len(body)} bytes is over the limit of {max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"body is not valid JSON: {exc}") from None
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise OpenAIError(400, f"not a chat-completions request: {validation_summary(exc)}") from None
    if req.model not in (served_model, "auto"):
        raise OpenAIError(404, f"this endpoint serves {served_model!r}, not {req.model!r}", "model_not_found")
    refusals = [(req.stream, "stream: true (judges read whole answers; use a vLLM server for streaming)"),
                (req.n != 1, "n other than 1"), (bool(req.tools), "tools"), (bool(req.logprobs), "logprobs"),
                (bool(req.stop), "stop sequences")]
    for refused, what in refusals:
        if refused:
            raise OpenAIError(400, f"{what} is not supported by the rexeval judge endpoint", "unsupported_parameter")
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m, i)}
                for i, m in enumerate(req.messages)]
    sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p,
                              max_tokens=req.max_completion_tokens or req.max_tokens or 512,
                              seed=req.seed if req.seed is not None else 0)
    return ChatRequest(messages=messages, sampling=sampling, json_schema=_schema(req.response_format))


def chat_completion(result: LLMResult, model_id: str) -> dict[str, Any]:
    """Our LLMResult -> an OpenAI ChatCompletion body (raise OpenAIError on an error result)."""
    if not result.ok:
        if result.transient:  # the backend's call failed, not the request: worth a retry (OpenAI clients retry 503)
            raise OpenAIError(503, result.error or "the judge backend is unavailable", "unavailable", "server_error")
        raise OpenAIError(500, result.error or "the judge backend gave no text", "backend_error", "server_error")
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                     "finish_reason": result.finish_reason or "stop", "logprobs": None}],
        "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                  "total_tokens": result.prompt_tokens + result.completion_tokens},
    }


def models_list(model_id: str) -> dict[str, Any]:
    """GET /v1/models: the one model this endpoint serves."""
    return {"object": "list",
            "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "rexeval"}]}
