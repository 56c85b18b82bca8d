"""The OpenAI-compatible reference server of loadgen/delay_server.py (aiohttp): /v1/completions
and /v1/chat/completions stream the Pacer's schedule as server-sent events ("tok " a token, a
chat stream opening with a role event, its first --reasoning-tokens tokens as
`reasoning_content` deltas), then usage (stream_options.include_usage) and [DONE];
/v1/models names the model "delay"; /health answers 200 as vLLM's does (AIPerf and GuideLLM
check it); /metrics is vLLM's, from what the server did (loadgen/reference/exposition.py).
Each chunk carries `server_elapsed_us`, as this project's server does, so delivery lag is
measured over HTTP too.

Faults: `http-500` (an error reply), `not-sse` (a JSON body instead of a stream), `no-done`
(no [DONE] at the end), `bad-json` (one event that is not JSON, then the stream goes on),
`error-event` (an error event after the first chunk, and the end), `drop` (the connection
closed after the first chunk); with --routed-experts, `routing-none` (the reply without them),
`routing-range` (an id past the experts), `routing-layers` (a layer fewer), `routing-base64`
(base64 that does not decode) and `routing-truncated` (the ids end mid-token).

A request with `stream` false gets one JSON reply after the same schedule, as vLLM's
non-streamed completions do. --routed-experts vllm sends each request's routed experts
(loadgen/reference/seeded_routing.py) as vLLM does: only in such a reply, base64 of an .npy
file on its choice; sglang as SGLang does when the request asks (`return_routed_experts`), base64 in
`sglext` on a chunk of its own; /expert_truth answers what was sent, and the SGLang recorder's
endpoints are served (loadgen/reference/recorder.py).
"""

from __future__ import annotations

import json

from aiohttp import web

from loadgen.reference.exposition import exposition
from loadgen.reference.pacer import Message, Pacer
from loadgen.reference.recorder import recorder_routes

WORD = "tok "  # one token: one word, 4 characters
MODEL = "delay"


def event(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def prompt_of(body: dict, chat: bool) -> list:
    """The prompt's tokens as the server counts them: the ids sent, else a word a token."""
    if chat:
        return json.dumps(body.get("messages")).split()
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, list) else str(prompt or "").split()


def metrics_app(protocol: str, pacer: Pacer) -> web.Application:
    """An app serving the protocol's /metrics alone (the gRPC servers' side port)."""
    application = web.Application()
    application.add_routes([metrics_route(protocol, pacer)])
    return application


def metrics_route(protocol: str, pacer: Pacer):
    body = exposition(protocol, pacer.tally)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=body(), content_type="text/plain",
                            headers={"X-Content-Type-Version": "0.0.4"})

    return web.get("/metrics", metrics)


def app(pacer: Pacer) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        owner = {"vllm": "vllm", "sglang": "sglang"}.get(pacer.args.routed_experts, "delay")
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": owner}]})

    async def truth(request: web.Request) -> web.Response:
        return web.json_response(pacer.truth.json())

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def generate(request: web.Request) -> web.StreamResponse:
        return await completion(pacer, request)

    application = web.Application()
    application.add_routes([web.get("/v1/models", models), web.get("/health", health),
                            web.post("/v1/completions", generate),
                            web.post("/v1/chat/completions", generate),
                            web.get("/expert_truth", truth), *recorder_routes(pacer),
                            metrics_route("openai", pacer)])
    return application


def refusal(fault: str, max_tokens: int) -> web.Response | None:
    """The whole reply of a fault that sends no stream (http-500, not-sse), else None."""
    if fault == "http-500":
        return web.json_response({"error": {"message": "delay server: an injected fault",
                                            "type": "internal_error", "code": 500}}, status=500)
    if fault == "not-sse":
        return web.json_response({"choices": [{"index": 0, "text": WORD * max_tokens}]})
    return None


def choices(m: Message, chat: bool, thinking: int, token_ids: bool) -> list[dict]:
    """One message's choices: a chat stream's first `thinking` tokens are reasoning, as vLLM's
    and SGLang's reasoning parsers send them; a message across the turn is sent as two. The
    stream's last choice has finish_reason "length"."""
    reasoned = max(0, min(m.tokens, thinking - m.index))
    parts = [(n, kind) for n, kind in ((reasoned, "reasoning_content"),
                                       (m.tokens - reasoned, "content")) if n]
    out = []
    for k, (n, kind) in enumerate(parts):
        choice = {"index": 0, "delta": {kind: WORD * n}} if chat else {"index": 0, "text": WORD * n}
        choice["finish_reason"] = "length" if m.last and k == len(parts) - 1 else None
        if token_ids:
            choice["token_ids"] = [65] * n
        out.append(choice)
    return out


async def broken_after_first(response: web.StreamResponse, request: web.Request,
                             fault: str) -> bool:
    """After the first message: a bad-json event (the stream goes on), or an error event or
    a dropped connection, which end it (True)."""
    if fault == "bad-json":
        await response.write(b"data: {not json\n\n")
    if fault == "error-event":
        await response.write(event({"error": {"message": "delay server: an injected fault",
                                              "code": 500}}))
        return True
    if fault == "drop":
        request.transport.close()
        return True
    return False


async def completion(pacer: Pacer, request: web.Request) -> web.StreamResponse:
    """/v1/completions and /v1/chat/completions: the pacer's messages as server-sent events,
    or, not streamed, as one reply when the last is due."""
    body = await request.json()
    chat = request.path.endswith("/chat/completions")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    fault = pacer.fault()
    if (refused := refusal(fault, max_tokens)) is not None:
        return refused
    prompt = prompt_of(body, chat)
    if body.get("stream") is False:
        return await whole_reply(pacer, body, chat, (prompt, max_tokens), fault)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    envelope = {"id": "cmpl-delay", "object": "chat.completion.chunk" if chat
                else "text_completion", "created": 0, "model": MODEL}
    if chat:
        await response.write(event(envelope | {"choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))
    event_routing = {}  # drawn at the last message: TTFT does not pay
    thinking = pacer.args.reasoning_tokens if chat else 0
    token_ids = bool(body.get("return_token_ids"))
    async for m in pacer.messages(max_tokens, prompt):
        if m.last:
            _, event_routing = pacer.routing(body, len(prompt), max_tokens, fault)
        for choice in choices(m, chat, thinking, token_ids):
            await response.write(event(envelope | {
                "choices": [choice], "server_elapsed_us": m.elapsed_us}))
        if m.index == 0 and await broken_after_first(response, request, fault):
            return response
    if event_routing:  # SGLang: a chunk of its own, no choices
        await response.write(event(envelope | {"choices": []} | event_routing))
    if (body.get("stream_options") or {}).get("include_usage"):
        await response.write(event(envelope | {"choices": [],
                                               "usage": usage_of(prompt, max_tokens)}))
    if fault != "no-done":
        await response.write(event("[DONE]"))
    await response.write_eof()
    return response


def usage_of(prompt: list, max_tokens: int) -> dict:
    return {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
            "total_tokens": len(prompt) + max_tokens}


async def whole_reply(pacer: Pacer, body: dict, chat: bool, asked: tuple[list, int],
                      fault: str) -> web.Response:
    """A request not streamed (asked: its prompt and max tokens): its reply once the schedule's
    last message is due, its routed experts on the choice (vLLM's) or the reply (SGLang's)."""
    prompt, max_tokens = asked
    async for _ in pacer.messages(max_tokens, prompt):
        pass
    choice_routing, reply_routing = pacer.routing(body, len(prompt), max_tokens, fault)
    text = WORD * max_tokens
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
              else {"index": 0, "text": text}) | {"finish_reason": "length"} | choice_routing
    if body.get("return_token_ids"):
        choice["token_ids"] = [65] * max_tokens
    return web.json_response({"id": "cmpl-delay", "object": "chat.completion" if chat
                              else "text_completion", "created": 0, "model": MODEL,
                              "choices": [choice], "usage": usage_of(prompt, max_tokens)}
                             | reply_routing)


async def serve_app(application: web.Application, port: int):
    """The app started on its loopback port (0: any free one): (port, its stop)."""
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner.addresses[0][1], runner.cleanup


async def start(protocol: str, pacer: Pacer):
    """The server started on its loopback port (--port; 0: any free one): (port, its stop)."""
    return await serve_app(app(pacer), pacer.args.port)
