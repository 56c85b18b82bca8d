"""The OpenAI-compatible HTTP face of the server (`python -m server --http-port PORT`), on aiohttp
in the gRPC server's event loop: /v1/completions and /v1/chat/completions (streamed as
server-sent events, or whole), /v1/models and /health, served by the same engine thread,
policies and telemetry as the gRPC service through server/frontends/admission.py, so the same
requests are accepted and refused with the same messages.

Errors follow OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for what
gRPC calls INVALID_ARGUMENT, 429 for RESOURCE_EXHAUSTED, 503 while draining or after the engine
failed, 404 for an unknown model or path. A failure mid-stream is an `error` event and the
stream ends without `[DONE]`. vLLM's extensions a benchmark needs are accepted: `ignore_eos`,
`min_tokens`, `priority`, `return_token_ids`; with --enable-return-routed-experts a reply not
streamed carries vLLM's `routed_experts` on its choice, as vLLM 0.32 sends them (its
vllm/entrypoints/openai/completion/serving.py): base64 of an .npy file of uint8 ids (uint16 past
id 255), [rows, layers, top-k], one row per prompt token from `routed_experts_prompt_start` (and
past the prefix cache's tokens, whose routing this server does not keep) and per output token
but the last; a streamed reply carries none, as vLLM's. Each chunk also carries
`server_elapsed_us`, the server's time from receiving the request to sending the chunk, and
the usage the server's own times as the gRPC Usage has them (`queue_us`, `prefill_us`,
`decode_us`, `ttft_us`; docs/targets.md). /metrics serves the same families as --metrics-port.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from records.server_settings import Serving
from server.errors import InvalidRequestError, ServerError, ShutdownError
from server.frontends.admission import Admission, Batch, GenerationRequest
from server.frontends.security import Guard, Tokens, client_of
from server.frontends.statuses import retry_after_s, status_of
from server.scheduling.requests import FinishReason

OPEN = Guard(None, None, None)  # plaintext, no token

FINISH_REASONS = {reason: reason.lower() for reason in FinishReason}  # OpenAI's words
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
def error_body(status: int, kind: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, kind: str, message: str, param: str | None = None):
    return web.json_response(error_body(status, kind, message, param), status=status)


def body_of(error: Exception) -> dict:
    """A domain error (server/errors.py) or the engine's own, as an OpenAI error body."""
    status, message = status_of(error)
    return error_body(status.http, status.kind, message)


def response_of(error: Exception) -> web.Response:
    """The error's reply; a retry hint (a full queue, a quota) as Retry-After, in seconds."""
    body = body_of(error)
    retry_s = retry_after_s(error)
    headers = {"Retry-After": str(max(1, math.ceil(retry_s)))} if retry_s is not None else None
    return web.json_response(body, status=body["error"]["code"], headers=headers)


@dataclass(frozen=True)
class CompletionRequest:
    """One completions request, read from its body: what to generate and how to answer."""

    ask: GenerationRequest
    chat: bool
    stream: bool
    include_usage: bool
    token_ids: bool  # return_token_ids: each choice carries its token ids
    routing_start: int = 0  # routed_experts_prompt_start: prompt tokens left out of its routing


def _field(body: dict, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is no count of tokens
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
        names = "/".join(k.__name__ for k in _tuple(kind))
        raise InvalidRequestError(f"{name} must be {names}, got {json.dumps(value)}")
    return value


def _tuple(kind) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _prompt(body: dict) -> dict:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):
        return {"prompt_ids": tuple(prompt)}
    if isinstance(prompt, list) and prompt:
        raise InvalidRequestError("prompt: one prompt per request (text or a list of token ids)")
    raise InvalidRequestError("prompt is missing: give text or a list of token ids")


def _chat_prompt(body: dict) -> dict:
    """The messages as this byte-level model's text: `role: content` lines, then the
    assistant's turn."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content}")
    lines = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str) or not isinstance(m.get("role"), str):
            raise InvalidRequestError(f"each message needs a role and text content, got "
                                      f"{json.dumps(m)[:200]}")
        lines.append(f"{m['role']}: {content}\n")
    return {"prompt": "".join(lines) + "assistant: "}


def call_of(body: Any, chat: bool, model: str) -> CompletionRequest:
    """The request in a body, or InvalidRequestError naming the field; LookupError for another
    model than this server's."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    asked = _field(body, "model", str, model)
    if asked != model:
        raise LookupError(f"The model `{asked}` does not exist: this server serves `{model}` "
                          "(GET /v1/models)")
    if _field(body, "n", int, 1) != 1:
        raise InvalidRequestError("n: this server generates one choice per request")
    max_tokens = _field(body, "max_tokens", int, None)
    if chat:
        max_tokens = _field(body, "max_completion_tokens", int, max_tokens)
    options = _field(body, "stream_options", dict, {})
    prompt = _chat_prompt(body) if chat else _prompt(body)
    ask = GenerationRequest(request_id=_field(body, "request_id", str, ""),
                            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                            ignore_eos=_field(body, "ignore_eos", bool, False),
                            min_tokens=_field(body, "min_tokens", int, 0),
                            temperature=float(_field(body, "temperature", (int, float), 1.0)),
                            seed=_field(body, "seed", int, 0),
                            priority=_field(body, "priority", int, 0), **prompt)
    start = _field(body, "routed_experts_prompt_start", int, 0)
    if start < 0:
        raise InvalidRequestError(f"routed_experts_prompt_start must be at least 0, got {start}")
    return CompletionRequest(ask, chat, _field(body, "stream", bool, False),
                             bool(options.get("include_usage")),
                             _field(body, "return_token_ids", bool, False), start)


class OpenAIApi:
    def __init__(self, admission: Admission, model: str, tokens: Tokens | None = None,
                 reasoning_tokens: int = 0, metrics: CollectorRegistry | None = None):
        """reasoning_tokens: chat answers stream their first this many as reasoning; metrics:
        the families /metrics serves (server/frontends/prometheus.py)."""
        self.metrics = metrics
        self.admission = admission
        self.model = model
        self.tokens = tokens
        self.reasoning_tokens = reasoning_tokens
        self.created = int(time.time())

    def app(self, max_body_bytes: int) -> web.Application:
        app = web.Application(middlewares=[self.not_found, self.authorized],
                              client_max_size=max_body_bytes)
        app.add_routes([web.get("/health", self.health), web.get("/v1/models", self.models),
                        web.post("/v1/completions", self.completions),
                        web.post("/v1/chat/completions", self.chat_completions)])
        if self.metrics is not None:
            app.add_routes([web.get("/metrics", self.metrics_text)])
        return app

    async def metrics_text(self, request: web.Request) -> web.Response:
        """The Prometheus exposition, built off the event loop (it reads the engine thread's
        telemetry under its lock)."""
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest,
                                                                self.metrics)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @web.middleware
    async def not_found(self, request: web.Request, handler):
        """A wrong path or method answered in OpenAI's error shape, naming what exists."""
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return error_response(404, "not_found", f"no route {request.path}; this server has "
                                  "/v1/completions, /v1/chat/completions, /v1/models, /health, "
                                  "/metrics")
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return error_response(405, "invalid_request_error",
                                  f"{request.method} {request.path}: use {allowed}")

    @web.middleware
    async def authorized(self, request: web.Request, handler):
        """With --auth-token-file, /v1/ needs a listed bearer token (401 in OpenAI's shape);
        /health stays open for load balancers."""
        if (self.tokens is None or not request.path.startswith("/v1/")
                or self.tokens.caller(request.headers.get("Authorization", ""))):
            return await handler(request)
        return error_response(401, "invalid_api_key", "a valid bearer token is required: send "
                              "'Authorization: Bearer TOKEN' with a token from the server's "
                              "--auth-token-file")

    async def health(self, request: web.Request) -> web.Response:
        if self.admission.serving:
            return web.json_response({"status": "ok"})
        return error_response(503, "service_unavailable",
                              "draining for shutdown" if self.admission.draining
                              else "the engine is not running")

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": self.created,
                "owned_by": "moe-loadlab", "max_model_len": self.admission.limits.max_seq_len}
        return web.json_response({"object": "list", "data": [card]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received_ns = time.monotonic_ns()
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            return error_response(400, "invalid_request_error", f"the body is not JSON: {exc}")
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, "invalid_request_error",
                                  f"the body is over this server's limit of "
                                  f"{request.client_max_size} bytes (--max-message-bytes)")
        try:
            call = call_of(body, chat, self.model)
            client = client_of(request.headers.get("Authorization", ""), request.remote or "",
                               self.tokens)
            stream = self.admission.admit(call.ask, received_ns, client)
        except LookupError as exc:
            return error_response(404, "model_not_found", str(exc), "model")
        except ServerError as exc:
            return response_of(exc)
        async with stream:
            record_write = self.admission.engine_thread.record_write
            answer = CompletionResponse(call, self.model, received_ns, record_write,
                                        self.reasoning_tokens if chat else 0)
            if call.stream:
                return await answer.streamed(request, stream.batches())
            return await answer.whole(stream.batches())


class CompletionResponse:
    """The response to one call: chunks as server-sent events, or one JSON body."""

    def __init__(self, call: CompletionRequest, model: str, received_ns: int,
                 written: Callable[[float], None] = lambda ms: None, reasoning_tokens: int = 0):
        """written: told each token chunk's write delay, stamped -> the transport took it;
        reasoning_tokens: a chat answer's first this many tokens are reasoning (a batch that
        begins among them is reasoning whole)."""
        self.call, self.model, self.received_ns = call, model, received_ns
        self.written = written
        self.reasoning_tokens, self.tokens_out = reasoning_tokens, 0
        prefix = "chatcmpl" if call.chat else "cmpl"
        self.id = f"{prefix}-{call.ask.request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if call.chat else "text_completion"
        self.first_ns = 0  # when the first token went out (streamed) or came (whole)

    def thinking(self, batch: Batch) -> bool:
        """Whether the batch is reasoning; counts its tokens as sent."""
        thinking = self.tokens_out < self.reasoning_tokens
        self.tokens_out += len(batch.ids)
        return thinking

    def choice(self, batch: Batch, *, first: bool, streamed: bool, thinking: bool = False,
               reasoning: str = "") -> dict:
        """thinking: streamed, the batch is reasoning (its text, held-back characters and
        all, goes as reasoning_content); reasoning: whole, the answer's reasoning text."""
        reason = FINISH_REASONS.get(batch.finish_reason or "")
        if self.call.chat and streamed:
            delta = ({"reasoning_content": batch.text} if thinking
                     else {"content": batch.text})
            delta = {"role": "assistant", **delta} if first else delta
            out = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        elif self.call.chat:
            thought = {"reasoning_content": reasoning} if reasoning else {}
            out = {"index": 0, "message": {"role": "assistant", "content": batch.text, **thought},
                   "logprobs": None, "finish_reason": reason}
        else:
            out = {"index": 0, "text": batch.text, "logprobs": None, "finish_reason": reason}
        if self.call.token_ids:
            out["token_ids"] = batch.ids
        if not streamed and batch.usage is not None and batch.usage.routed_experts is not None:
            out["routed_experts"] = routed_npy(*batch.usage.routed_experts,
                                               self.call.routing_start)
        return out

    def envelope(self, streamed: bool) -> dict:
        kind = f"{self.object}.chunk" if streamed and self.call.chat else self.object
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def elapsed_us(self) -> int:
        return (time.monotonic_ns() - self.received_ns) // 1000

    async def emit(self, response: web.StreamResponse, event: dict) -> None:
        """A token chunk stamped with the server's time now, and written."""
        stamped_ns = time.monotonic_ns()
        self.first_ns = self.first_ns or stamped_ns
        await send(response, event | {"server_elapsed_us": (stamped_ns - self.received_ns) // 1000})
        self.written((time.monotonic_ns() - stamped_ns) / 1e6)

    async def streamed(self, request: web.Request, batches) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        first = True
        try:
            async for batch in batches:
                if isinstance(batch.error, ShutdownError):  # ends as a stream, with a reason
                    await send(response, self.envelope(True) | {
                        "choices": [self.choice(Batch([], "", FinishReason.ABORT), first=first,
                                                streamed=True)],
                        "server_elapsed_us": self.elapsed_us()})
                    break
                if batch.error is not None:
                    await send(response, body_of(batch.error))
                    return response  # no [DONE]: the stream did not end well
                await self.emit(response, self.envelope(True) | {
                    "choices": [self.choice(batch, first=first, streamed=True,
                                            thinking=self.thinking(batch))]})
                first = False
                if batch.usage is not None and self.call.include_usage:
                    await send(response, self.envelope(True) | {"choices": [],
                                                                "usage": self.usage(batch)})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client left; closing the stream cancels the request
            pass
        return response

    async def whole(self, batches) -> web.Response:
        ids, text, thought, last = [], [], [], None
        async for batch in batches:
            if batch.error is not None:
                return response_of(batch.error)
            self.first_ns = self.first_ns or time.monotonic_ns()
            ids += batch.ids
            (thought if self.thinking(batch) else text).append(batch.text)
            last = batch
        whole = Batch(ids, "".join(text), last.finish_reason, last.usage)
        return web.json_response(self.envelope(False) | {
            "choices": [self.choice(whole, first=True, streamed=False,
                                    reasoning="".join(thought))],
            "usage": self.usage(whole)})

    def usage(self, batch: Batch) -> dict:
        """OpenAI's usage, and the server's own times (microseconds): received -> admitted,
        the prefill's engine time, first -> last token, received -> first token out."""
        u = batch.usage
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens, "queue_us": u.queue_us,
                "prefill_us": u.prefill_us, "decode_us": u.decode_us,
                "ttft_us": (self.first_ns - self.received_ns) // 1000}


def routed_npy(prompt: torch.Tensor, output: torch.Tensor, start: int) -> str:
    """A request's routing as vLLM's routed_experts: the prompt's rows from `start` and past
    the prefix cache's (-1 rows: they lead the prompt), then the output's; an .npy file of
    uint8 (uint16 past id 255), base64."""
    cached = int((prompt < 0).all(dim=(1, 2)).sum()) if len(prompt) else 0
    rows = torch.cat([prompt[max(start, cached):], output]).numpy()
    buffer = io.BytesIO()
    np.save(buffer, rows.astype(np.uint8 if rows.size == 0 or rows.max() < 256 else np.uint16),
            allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


async def send(response: web.StreamResponse, event: dict) -> None:
    await response.write(f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode())


async def start_http(admission: Admission, model: str, serving: Serving, max_body_bytes: int,
                     guard: Guard = OPEN, metrics: CollectorRegistry | None = None
                     ) -> tuple[web.AppRunner, int]:
    """The API listening on --host:--http-port (0 = any free port), over TLS and checking
    tokens where the guard says, with metrics' families at /metrics; returns its runner and
    bound port. Cleaning the runner up gives open streams --grace-s to finish."""
    # handler_cancellation: a client that leaves cancels its request at once, as over gRPC
    api = OpenAIApi(admission, model, guard.tokens, serving.reasoning_tokens, metrics)
    runner = web.AppRunner(api.app(max_body_bytes), shutdown_timeout=serving.grace_s,
                           access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, serving.host, serving.http_port, ssl_context=guard.ssl_context)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, bound
