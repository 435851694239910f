"""The judge endpoint in OpenAI's chat-completions shape, so any OpenAI client can call it.

`POST <route>/v1/chat/completions` takes a `ChatCompletionRequest` and answers a
`ChatCompletion`; `GET <route>/v1/models` lists the one served model and
`GET <route>/v1/models/{model}` answers its model object. The request becomes one of
our `ChatRequest`s, so it joins the deployment's batches with every other caller's.
Pure functions here (tested without Serve); the routing is in judge.py.

Errors are OpenAI's, to the letter, so an OpenAI client raises the exception it would
against OpenAI: every refusal on a /v1 route is `{"error": {"message", "type", "param",
"code"}}`; a bad or over-limit field is 400 `invalid_request_error` with `param` naming
the field (`max_tokens`, `messages[0].content`; code `invalid_value`,
`missing_required_parameter`, `invalid_type`, `array_above_max_length`,
`string_above_max_length`, `unsupported_parameter`); 413 only for a body over the size
limit; an unknown model 404 `model_not_found`; a missing or wrong token 401 (code
`invalid_api_key` for a wrong one); failures of the server 500/503 of type `server_error`.

What is not supported, answered 400 (`unsupported_parameter`, with `param`) rather than
ignored: streaming (`stream: true`: judges read whole answers; a client wanting tokens
as they come should call a vLLM server directly), `n` > 1, tools / function calls,
logprobs, stop sequences, and non-text message parts (images). `model` must be the
served model's id (or "auto"): the call cache and every report name the model that
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
from rexeval.serve.common import RequestError

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
MODEL_PATH = "/v1/models/{model}"
"""The route of one model's object; the id is the rest of the path (ids may hold '/')."""
OPENAI_PREFIX = "/v1"
DEFAULT_MAX_TOKENS = 512


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


def error_type(status: int) -> str:
    """OpenAI's error `type` for a status: the server's failures are `server_error`,
    everything the request did wrong `invalid_request_error`."""
    return "server_error" if status >= 500 else "invalid_request_error"


class OpenAIError(RequestError):
    """A refusal in OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 type_: str | None = None, param: str | None = None):
        super().__init__(status, message, code, param)
        self.type = type_ or error_type(status)

    def body(self) -> dict[str, Any]:
        return openai_error_body(self)


def openai_error_body(exc: RequestError) -> dict[str, Any]:
    """Any refusal in OpenAI's error shape (the type from its status unless it has one)."""
    return {"error": {"message": str(exc), "type": getattr(exc, "type", None) or error_type(exc.status),
                      "param": exc.param, "code": exc.code}}


def _param(loc: tuple) -> str | None:
    """A pydantic error location as OpenAI names the field: messages[0].content."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _validation_error(exc: ValidationError) -> OpenAIError:
    first = exc.errors()[0]
    param, kind = _param(tuple(first["loc"])), first["type"]
    if kind == "missing":
        return OpenAIError(400, f"Missing required parameter: {param!r}.", "missing_required_parameter",
                           param=param)
    code = "invalid_type" if kind.endswith(("_type", "_parsing")) else "invalid_value"
    where = f"Invalid {param!r}" if param else "Invalid body"
    more = f" ({exc.error_count()} problems; this is the first)" if exc.error_count() > 1 else ""
    return OpenAIError(400, f"{where}: {first['msg']}.{more}", code, param=param)


def _text(message: OpenAIMessage, i: int) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"messages[{i}]: only text content parts are supported", "unsupported_content",
                              param=f"messages[{i}].content")
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
            raise OpenAIError(400, "response_format.json_schema.schema must be a JSON schema object",
                              "invalid_value", param="response_format.json_schema.schema")
        return schema
    raise OpenAIError(400, f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                      "invalid_value", param="response_format.type")


def model_not_found(requested: str, served_model: str) -> OpenAIError:
    """OpenAI's 404 for a model it does not serve (its message, with which one we do)."""
    return OpenAIError(404, f"The model `{requested}` does not exist or you do not have access to it. "
                            f"This endpoint serves {served_model!r}.", "model_not_found")


def parse_chat_completion(body: bytes, served_model: str, max_body_bytes: int, limits: Any = None) -> ChatRequest:
    """One OpenAI chat-completions body -> our ChatRequest, or raise OpenAIError.

    `limits` (the judge's `JudgeLimits`: max_messages, max_chars, max_tokens) refuses an
    over-limit field with 400 and its `param`, as OpenAI does; a request without
    max_tokens gets the smaller of 512 and the limit."""
    if len(body) > max_body_bytes:
        raise OpenAIError(413, f"body of {len(body)} bytes is over the limit of {max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"We could not parse the JSON body of your request: {exc}") from None
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if req.model not in (served_model, "auto"):
        raise model_not_found(req.model, served_model)
    refusals = [(req.stream, "stream", "stream: true (judges read whole answers; use a vLLM server for streaming)"),
                (req.n != 1, "n", "n other than 1"), (bool(req.tools), "tools", "tools"),
                (bool(req.logprobs), "logprobs", "logprobs"), (bool(req.stop), "stop", "stop sequences")]
    for refused, param, what in refusals:
        if refused:
            raise OpenAIError(400, f"{what} is not supported by the rexeval judge endpoint", "unsupported_parameter",
                              param=param)
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m, i)}
                for i, m in enumerate(req.messages)]
    asked = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    max_tokens = req.max_completion_tokens or req.max_tokens
    if limits is not None:
        _check_limits(messages, asked, max_tokens, limits)
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, limits.max_tokens) if limits is not None else DEFAULT_MAX_TOKENS
    sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, max_tokens=max_tokens,
                              seed=req.seed if req.seed is not None else 0)
    return ChatRequest(messages=messages, sampling=sampling, json_schema=_schema(req.response_format))


def _check_limits(messages: list[dict], asked: str, max_tokens: int | None, limits: Any) -> None:
    """400 with the field at fault for a request over the endpoint's limits."""
    if len(messages) > limits.max_messages:
        raise OpenAIError(400, f"Invalid 'messages': array too long. Expected an array with maximum length "
                               f"{limits.max_messages}, but got an array with length {len(messages)} instead.",
                          "array_above_max_length", param="messages")
    for j, m in enumerate(messages):
        if len(m["content"]) > limits.max_chars:
            raise OpenAIError(400, f"Invalid 'messages[{j}].content': string too long. Expected a string with "
                                   f"maximum length {limits.max_chars}, but got a string with length "
                                   f"{len(m['content'])} instead.", "string_above_max_length",
                              param=f"messages[{j}].content")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise OpenAIError(400, f"{asked} is too large: {max_tokens}. This endpoint supports at most "
                               f"{limits.max_tokens} completion tokens, whereas you provided {max_tokens}.",
                          "invalid_value", param=asked)


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


def model_object(model_id: str) -> dict[str, Any]:
    """OpenAI's model object for the served model."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "rexeval"}


def models_list(model_id: str) -> dict[str, Any]:
    """GET /v1/models: the one model this endpoint serves."""
    return {"object": "list", "data": [model_object(model_id)]}


def model_id_in(path: str) -> str | None:
    """The model id of a GET /v1/models/{model} path (ids may hold '/'), else None."""
    prefix = MODELS_PATH + "/"
    return path[len(prefix):] if path.startswith(prefix) and len(path) > len(prefix) else None


def retrieve_model(path: str, served_model: str) -> dict[str, Any]:
    """GET /v1/models/{model}: the served model's object ("auto", which chat calls
    accept, names it too), else OpenAI's 404 `model_not_found`."""
    requested = model_id_in(path) or ""
    if requested not in (served_model, "auto"):
        raise model_not_found(requested, served_model)
    return model_object(served_model)


def openai_route(path: str) -> str:
    """The route a path below the app is served under (a model's path -> MODEL_PATH)."""
    return MODEL_PATH if model_id_in(path) is not None else path
