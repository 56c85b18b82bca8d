"""The `openai` target: OpenAI-compatible streaming over HTTP/1.1 server-sent events (vLLM,
SGLang, TGI, llama.cpp, Ollama, this project's server with --http-port).

One request is one POST to --endpoint (/v1/completions: the prompt as token ids, so its length
is exact; /v1/chat/completions: as one user message of text) with `stream`,
`stream_options.include_usage` and, with --exact-length, vLLM's `ignore_eos` and `min_tokens`.
Each event is one message: its text (or its token ids, with --token-ids), the finish reason,
the usage on the last, and `server_elapsed_us` where the server sends it (this project's
servers). The stream must end with `[DONE]`.

A request the workload sends whole (RequestSpec.stream False, --routed-experts-sample) goes with
`stream` false where routing is asked: vLLM and this project's server put the routed experts in
a non-streamed reply only. Its one JSON reply is one message holding every token (Chunk.whole).

Greenlets read with geventhttpclient (the HTTP client of Locust's FastHttpUser) and the aio
sender with loadgen/targets/http1.py; both reuse connections and read in large blocks (a
64 KiB buffer, aiohttp's default, costs at long contexts: vllm-project/vllm#39963).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson

from loadgen.targets.credentials import Credentials
from loadgen.targets.http1 import READ_BLOCK, Pool
from loadgen.targets.routed_experts import ENGINES_THAT_ANSWER, carries_routing
from loadgen.targets.sniff import GRPC, spoken
from loadgen.targets.sse import EventStream
from loadgen.targets.target import Chunk, Receiver, RequestSpec, TargetError, failure_of
from records.load_settings import TargetSettings

MAX_STREAMS = 100_000  # connections one user's pool may open: never a limit on in-flight requests
ERROR_BODY = 4096  # bytes of an error reply kept for its message
MODELS_BODY = 1024 * 1024  # bytes of /v1/models read for the model's name
WHOLE_BODY = 256 * 1024 * 1024  # bytes of a non-streamed reply read, routed experts and all
SENDS_TOKEN_IDS = ("vllm", "moe-loadlab")  # /v1/models' owned_by of servers taking return_token_ids
CONNECT_S = 10.0  # the aio sender's wait for a new connection
DONE = "[DONE]"


def base_url(host: str) -> str:
    """http://HOST:PORT from --host (http:// when it has no scheme)."""
    return (host if "://" in host else f"http://{host}").rstrip("/")


def error_message(status: int, body: bytes) -> TargetError:
    """An HTTP error reply: its OpenAI-style message where the body has one."""
    text = body.decode("utf-8", errors="replace")
    try:
        detail = json.loads(text)
        error = detail.get("error", detail) if isinstance(detail, dict) else detail
        message = error.get("message", text) if isinstance(error, dict) else str(error)
    except ValueError:
        message = text
    return TargetError(f"HTTP_{status}", " ".join(str(message).split())[:300])


# what a usage object's integers the run keeps: the token counts, and this project's server's own
# times (queue, prefill, decode, TTFT, as its gRPC Usage has them), which other servers do not send
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "queue_us", "prefill_us", "decode_us",
              "ttft_us")

class Reader:
    """An event stream's messages, from its bytes as they come or a line at a time; `done`
    once [DONE] came."""

    def __init__(self, target: OpenAITarget):
        self.target = target
        self.events = EventStream()
        self.done = False
        self.size = 0  # the bytes read since the last message

    def feed(self, data: bytes, arrived_ns: int, receiver: Receiver) -> bool:
        """Body bytes as a read brought them (arrived_ns: when): each message they end to the
        receiver; True once the stream is done or the client leaves it."""
        self.size += len(data)
        for event in self.events.feed(data):
            chunk = self.data(event, arrived_ns)
            if self.done or receiver.take(chunk):
                return True
        return False

    def line(self, line: bytes, arrived_ns: int = 0) -> Chunk | None:
        """arrived_ns: when the line reached the client (0: unknown)."""
        self.size += len(line)
        data = self.events.line(line)
        return None if data is None else self.data(data, arrived_ns)

    def data(self, data: str, arrived_ns: int = 0) -> Chunk | None:
        chunk = self.target.chunk_of(data, arrived_ns)
        self.done = chunk is None
        if chunk is not None:
            chunk.size, self.size = self.size, 0
        return chunk

    def finish(self) -> None:
        """At the end of the body: an event left open counts; without [DONE] the stream is
        INCOMPLETE."""
        if not self.done and (data := self.events.end()) is not None:
            self.data(data)
        if not self.done:
            raise TargetError("INCOMPLETE", "the event stream ended without [DONE]")


class OpenAITarget:
    name = "openai"
    over_http = True
    takes_text = True
    replies_text = True
    required: tuple[str, ...] = ()

    def __init__(self, settings: TargetSettings):
        self.settings = settings
        self.chat = settings.endpoint.rstrip("/").endswith("/chat/completions")
        self.model = settings.model  # "" until /v1/models names one
        self.owner = ""  # the engine /v1/models names (its owned_by), "" until it answers
        self.reads_routing = settings.routed_experts != "off"
        self.credentials = Credentials(settings)
        key = settings.api_key or os.environ.get("OPENAI_API_KEY", "")
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                        **({"Authorization": f"Bearer {key}"} if key else
                           self.credentials.header)}
        for header in settings.headers:
            name, _, value = header.partition(":")
            self.headers[name.strip()] = value.strip()

    @property
    def token_ids(self) -> bool:
        """--token-ids, or by default where /v1/models names a server that sends them."""
        asked = self.settings.token_ids
        return asked if asked is not None else self.owner in SENDS_TOKEN_IDS

    @property
    def streams_text(self) -> bool:
        return not self.token_ids

    @property
    def asks_routing(self) -> bool:
        """--routed-experts on, or auto and /v1/models names an engine that answers."""
        mode = self.settings.routed_experts
        return mode == "on" or (mode == "auto" and self.owner in ENGINES_THAT_ANSWER)

    # --- the protocol ---

    def whole(self, spec: RequestSpec) -> bool:
        """Whether the request goes non-streamed: the workload drew it so, and it asks for
        routing here (a server that sends none gets every request streamed)."""
        return not spec.stream and self.asks_routing

    def body(self, spec: RequestSpec) -> bytes:
        s = self.settings
        body = ({"max_tokens": spec.max_tokens, "stream": False} if self.whole(spec) else
                {"max_tokens": spec.max_tokens, "stream": True,
                 "stream_options": {"include_usage": True}})
        if self.model:
            body["model"] = self.model
        if self.chat:
            turns = spec.dialogue or (spec.text,)
            body["messages"] = [{"role": ("user", "assistant")[i % 2], "content": text}
                                for i, text in enumerate(turns)]
        else:
            body["prompt"] = list(spec.prompt_ids) or spec.prompt_text
        if s.exact_length:
            body |= {"ignore_eos": True, "min_tokens": spec.max_tokens}
        if self.token_ids:
            body["return_token_ids"] = True
        if self.asks_routing:  # SGLang's switch; vLLM answers or not as it was started
            body["return_routed_experts"] = True
        return json.dumps(body).encode()

    def headers_of(self, spec: RequestSpec) -> dict[str, str]:
        """The request's headers: its id (X-Request-Id, which vLLM takes for its own, so its
        log names it: requests.jsonl's request_id), and a session's turn its session, for
        affinity."""
        session = {"X-Session-ID": spec.session} if spec.session else {}
        return {**self.headers, "X-Request-Id": spec.request_id, **session}

    def chunk_of(self, data: str, arrived_ns: int = 0) -> Chunk | None:
        """One event's data as a Chunk; None for [DONE]. arrived_ns: when its last line
        reached the client (0: unknown)."""
        if data == DONE:
            return None
        event, choice = parsed(data)
        part = (choice.get("delta") if self.chat else choice) if choice is not None else None
        return self.chunk(data, event, choice, part, arrived_ns)

    def whole_chunk(self, data: bytes, arrived_ns: int) -> Chunk:
        """A non-streamed reply as the one message holding all its tokens: the server's count
        (usage), else its ids' or its text's."""
        text = data.decode("utf-8", errors="replace")
        event, choice = parsed(text)
        if choice is None:
            raise TargetError("BAD_REPLY", f"a reply without a choice: {text[:200]!r}")
        part = choice.get("message") if self.chat else choice
        chunk = self.chunk(text, event, choice, part, arrived_ns)
        chunk.whole, chunk.size = True, len(data)
        if (counted := chunk.usage.get("completion_tokens")) is not None:
            chunk.history_text = chunk.history_text or self.said(part)[0]
            chunk.tokens, chunk.text = counted, ""
        return chunk

    def chunk(self, data: str, event: dict, choice: dict | None, part: dict | None,
              arrived_ns: int) -> Chunk:
        """event (data, parsed), its first choice and the part of it holding the text (a
        completion's choice, a chat delta or message) as a Chunk."""
        usage = event.get("usage")
        counts = {k: usage[k] for k in USAGE_KEYS
                  if isinstance(usage.get(k), int)} if usage else {}
        elapsed = event.get("server_elapsed_us", 0)
        routed = data if self.reads_routing and carries_routing(event, choice) else ""
        if choice is None:
            return Chunk(usage=counts, server_elapsed_us=elapsed if counts else 0,
                         arrived_ns=arrived_ns, routed=routed)
        answer, thinking, thinks = self.said(part)
        ids = choice.get("token_ids")
        ids = ids if isinstance(ids, list) else ()
        tokens = len(ids)
        return Chunk(tokens=tokens, text="" if tokens else answer + thinking, ids=ids,
                     history_text=answer if tokens else "",
                     server_elapsed_us=elapsed if isinstance(elapsed, int) else 0,
                     finish_reason=choice.get("finish_reason") or "", usage=counts,
                     reasoning=thinks and not answer, arrived_ns=arrived_ns, routed=routed)

    def said(self, part: dict | None) -> tuple[str, str, bool]:
        """(answer, reasoning, whether it reasons) of a completion choice, or of a chat delta
        or message."""
        part = part or {}
        if not self.chat:
            return str(part.get("text") or ""), "", False
        # vLLM and SGLang: reasoning_content; newer vLLM and OpenRouter: reasoning. A delta
        # with the key is reasoning even when its text is empty (a character held back
        # until whole: its token ids still came)
        thinks = any(part.get(k) is not None for k in ("reasoning_content", "reasoning"))
        thinking = str(part.get("reasoning_content") or part.get("reasoning") or "")
        return str(part.get("content") or ""), thinking, thinks

    def check_reply(self, status: int, content_type: str, body: bytes, whole: bool) -> None:
        """Raises unless the reply is the start of an event stream (whole: a JSON reply);
        body: an error's first bytes."""
        if status != 200:
            raise error_message(status, body)
        if whole and not content_type.startswith("application/json"):
            raise TargetError("BAD_REPLY", f"the server answered {content_type or 'no type'} "
                              "to a request not streamed, not JSON")
        if not whole and not content_type.startswith("text/event-stream"):
            raise TargetError("BAD_STREAM", f"the server answered {content_type or 'no type'}, "
                              f"not an event stream: does {self.settings.endpoint} stream?")

    # --- greenlets (geventhttpclient) ---

    def connect(self, host: str):
        from geventhttpclient import HTTPClient

        url = base_url(host)
        tls = ({"ssl_context_factory": lambda *_, **__: self.credentials.ssl_context()}
               if url.startswith("https://") else {})
        return HTTPClient.from_url(url, concurrency=MAX_STREAMS, connection_timeout=10,
                                   network_timeout=24 * 3600, block_size=READ_BLOCK, **tls)

    def stream(self, conn, spec: RequestSpec, timeout_s: float) -> Iterator[Chunk]:
        import gevent

        deadline = TargetError("DEADLINE_EXCEEDED", f"no end after {timeout_s:g} s "
                               "(--request-timeout-s)")
        with gevent.Timeout(timeout_s, deadline):
            response = conn.request("POST", self.settings.endpoint, body=self.body(spec),
                                    headers=self.headers_of(spec))
            try:
                status, whole = response.status_code, self.whole(spec)
                self.check_reply(status, response.get("content-type", ""),
                                 response.read(ERROR_BODY) if status != 200 else b"", whole)
                if whole:
                    yield self.whole_chunk(response.read(WHOLE_BODY), time.monotonic_ns())
                    return
                reader = Reader(self)
                while not reader.done and (line := response.readline(b"\n")):
                    if (chunk := reader.line(line)) is not None:
                        yield chunk
                reader.finish()
            finally:
                response.release()

    def close(self, conn) -> None:
        conn.close()

    # --- the aio sender (loadgen/targets/http1.py) ---

    async def aconnect(self, host: str) -> Pool:
        url = base_url(host)
        pool = Pool(url, self.credentials.ssl_context() if url.startswith("https://") else None,
                    CONNECT_S)
        if not self.model or self.settings.routed_experts == "auto":
            try:
                async with asyncio.timeout(5):
                    reply = await pool.request("GET", "/v1/models", self.headers)
                    try:
                        body = await reply.read(MODELS_BODY)
                    finally:
                        reply.release()
                if reply.status == 200:
                    self.model, self.owner = self.model or model_of(body), owner_of(body)
            except (OSError, http.client.HTTPException):
                pass  # the requests will say why
        return pool

    async def apush(self, conn: Pool, spec: RequestSpec, timeout_s: float,
                    receiver: Receiver) -> bool:
        """The request's messages, each handed to the receiver as its read arrives, in the
        connection's read callback (no task woken a message). Whether every read of the reply
        was timed by the kernel's receipt (loadgen/targets/stamped_socket.py). Raises on
        failure, as `stream`."""
        async with asyncio.timeout(timeout_s):
            response = await conn.request("POST", self.settings.endpoint, self.headers_of(spec),
                                          self.body(spec))
            try:
                status, whole = response.status, self.whole(spec)
                self.check_reply(status, response.headers.get("content-type", ""),
                                 await response.read(ERROR_BODY) if status != 200 else b"",
                                 whole)
                if whole:
                    data = await response.read(WHOLE_BODY)
                    receiver.take(self.whole_chunk(data, time.monotonic_ns()))
                    response.keep()
                    return False
                reader = Reader(self)

                def body(data: bytes, arrived_ns: int) -> bool:
                    return reader.feed(data, arrived_ns, receiver)

                # a stream the client left (it cancelled) is not kept: its connection closes
                if not (await response.consume(body) and not reader.done):
                    reader.finish()
                    response.keep()
                return response.reply.kernel_timed
            finally:
                response.release()

    async def aclose(self, conn: Pool) -> None:
        await conn.close()

    # --- failures and readiness ---

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """A refused, reset or half-read connection is UNAVAILABLE (geventhttpclient and
        loadgen/targets/http1.py say it with OSErrors and http.client's exceptions), past the
        deadline DEADLINE_EXCEEDED; the rest as every target."""
        if isinstance(exc, TimeoutError) and exc.errno is None:  # not the kernel's own
            return "DEADLINE_EXCEEDED", "no end within --request-timeout-s"
        if isinstance(exc, (OSError, http.client.HTTPException)):
            return "UNAVAILABLE", f"connection to the server failed: {type(exc).__name__}: " \
                                  f"{exc}"[:300]
        return failure_of(exc)

    def probe(self, host: str) -> str:
        """GET /v1/models: the server answers, and names the model when --model does not."""
        url = f"{base_url(host)}/v1/models"
        try:
            tls = self.credentials.ssl_context() if url.startswith("https://") else None
            with urllib.request.urlopen(urllib.request.Request(url, headers=self.headers),
                                        timeout=5, context=tls) as reply:
                body = reply.read()
                self.model, self.owner = self.model or model_of(body), owner_of(body)
        except http.client.HTTPException as exc:  # not HTTP/1.x: what does it speak?
            other = spoken(host)
            return (f"openai server at {base_url(host)} does not answer in HTTP/1.1"
                    + (f": it speaks {other}" if other == GRPC else f" ({exc!r:.100})"))
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                return f"openai server at {base_url(host)} refused GET /v1/models with HTTP " \
                       f"{exc.code}: check --api-key or --auth-token"
            if exc.code >= 500:
                return f"openai server at {base_url(host)} answered HTTP {exc.code} to GET " \
                       "/v1/models"
        except (OSError, ValueError) as exc:
            return f"openai server at {base_url(host)} is not answering: {exc}"
        return ""

    def stats(self, host: str) -> None:
        return None


def parsed(data: str) -> tuple[dict, dict | None]:
    """An event's (or a whole reply's) JSON object and its first choice (None: it has none);
    TargetError where it is not one, or says the server failed."""
    try:
        event = orjson.loads(data)  # an event in 0.85 us, json's 3.2
    except ValueError:  # orjson is strict where json is not (NaN, Infinity, huge integers)
        try:
            event = json.loads(data)
        except ValueError:
            raise TargetError("BAD_STREAM", f"an event is not JSON: {data[:200]!r}") from None
    if not isinstance(event, dict):
        raise TargetError("BAD_STREAM", f"an event is not a JSON object: {data[:200]!r}")
    if "error" in event:
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise TargetError("SERVER_ERROR", str(message)[:300])
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not isinstance(event.get("usage") or {}, dict):
        raise TargetError("BAD_STREAM", f"an event without a choices list: {data[:200]!r}")
    choice = choices[0] if choices else None
    if choice is not None and not isinstance(choice, dict):
        raise TargetError("BAD_STREAM", f"a choice is not a JSON object: {data[:200]!r}")
    return event, choice


def owner_of(body: bytes) -> str:
    """Who the first model /v1/models lists is owned by (vLLM and SGLang name themselves)."""
    try:
        data = json.loads(body).get("data") or []
        return str(data[0].get("owned_by", "")) if data else ""
    except (ValueError, AttributeError, TypeError, IndexError):
        return ""


def model_of(body: bytes) -> str:
    """The first model a /v1/models reply lists, "" when it lists none."""
    try:
        data = json.loads(body).get("data") or []
        return str(data[0]["id"]) if data else ""
    except (ValueError, AttributeError, KeyError, TypeError, IndexError):
        return ""
