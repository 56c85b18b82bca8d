"""The serving engines' own gRPC services, through the generated stubs of the `smg-grpc-proto`
package (the SGLang model gateway's definitions): `vllm-grpc` (VllmEngine), `sglang-grpc`
(SglangScheduler) and `trtllm-grpc` (TrtllmService).

All three take token ids and stream `chunk` messages of new token ids, then one `complete`
message with the finish reason and the server's counts; so lengths are exact (`ignore_eos`,
and `min_tokens` where the protocol has it) and so are token counts. None sends server-side
timing per message. A complete message's tokens count only where the chunks before it fell
short of its total. Readiness is each service's own HealthCheck.
"""

from __future__ import annotations

import grpc

from loadgen.targets.grpc_stream import GrpcTarget
from loadgen.targets.target import Chunk, MissingPackage, RequestSpec, TargetError


def _stubs(name: str):
    """The generated module pair of one engine protocol; a clear error when the package is
    missing."""
    import importlib

    try:
        return (importlib.import_module(f"smg_grpc_proto.generated.{name}_pb2"),
                importlib.import_module(f"smg_grpc_proto.generated.{name}_pb2_grpc"))
    except ImportError as exc:
        raise MissingPackage("the engine gRPC targets need the smg-grpc-proto package: "
                             f"pip install -e '.[targets]' ({exc})") from None


class EngineTarget(GrpcTarget):
    """A Generate stream of chunk/complete messages; subclasses build the request and name
    the fields that differ."""

    output_ids = "output_ids"  # the complete message's field of all output token ids
    replies_text = False  # the chunks carry token ids only

    def __init__(self, settings):
        super().__init__(settings)
        self.tokenizer = None

    def ids_of(self, spec: RequestSpec) -> list[int]:
        """The prompt's token ids: the workload's, or its text through --tokenizer (a dataset's
        prompts; the settings check makes sure there is one where the protocol needs ids)."""
        if spec.prompt_ids or not self.settings.tokenizer:
            return list(spec.prompt_ids)
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(self.settings.tokenizer)
        return self.tokenizer.encode(spec.text).ids

    def plain(self, msg) -> tuple[int, int] | None:
        if msg.WhichOneof("response") != "chunk" or not (tokens := len(msg.chunk.token_ids)):
            return None
        return tokens, 0

    def chunk_of(self, msg, seen: int) -> Chunk:
        kind = msg.WhichOneof("response")
        if kind == "chunk":
            return Chunk(tokens=len(msg.chunk.token_ids), ids=msg.chunk.token_ids)
        if kind != "complete":
            raise TargetError("BAD_STREAM", f"a Generate message with neither chunk nor "
                              f"complete: {str(msg)[:200]!r}")
        done = msg.complete
        total = max(len(getattr(done, self.output_ids)), done.completion_tokens)
        return Chunk(tokens=max(0, total - seen), finish_reason=done.finish_reason or "stop",
                     usage={"prompt_tokens": done.prompt_tokens,
                            "completion_tokens": done.completion_tokens})

    def probe(self, host: str) -> str:
        try:
            reply = self.ask(host, "HealthCheck", self.pb.HealthCheckRequest())
        except grpc.RpcError as exc:
            return self.not_answering(host, exc)
        return self.unhealthy(reply)

    def unhealthy(self, reply) -> str:
        """Why a HealthCheck reply says the engine is not ready, "" when it is."""
        return "" if reply.healthy else f"{self.name} server is not healthy: {reply.message}"


class VllmTarget(EngineTarget):
    name = "vllm-grpc"
    pb, stubs = _stubs("vllm_engine")
    stub_class = stubs.VllmEngineStub

    def request(self, spec: RequestSpec):
        n, ids = spec.max_tokens, self.ids_of(spec)
        prompt = ({"tokenized": self.pb.TokenizedInput(original_text=spec.text, input_ids=ids)}
                  if ids else {"text": spec.text})  # vLLM tokenizes text itself
        return self.pb.GenerateRequest(
            request_id=spec.request_id, stream=True,
            sampling_params=self.pb.SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True),
            **prompt)


class SglangTarget(EngineTarget):
    name = "sglang-grpc"
    takes_text = False
    pb, stubs = _stubs("sglang_scheduler")
    stub_class = stubs.SglangSchedulerStub

    def request(self, spec: RequestSpec):
        n = spec.max_tokens
        return self.pb.GenerateRequest(
            request_id=spec.request_id, stream=True,
            tokenized=self.pb.TokenizedInput(original_text=spec.text, input_ids=self.ids_of(spec)),
            sampling_params=self.pb.SamplingParams(max_new_tokens=n, min_new_tokens=n,
                                                   ignore_eos=True))


class TrtllmTarget(EngineTarget):
    name = "trtllm-grpc"
    takes_text = False
    pb, stubs = _stubs("trtllm_service")
    stub_class = stubs.TrtllmServiceStub
    output_ids = "output_token_ids"

    def request(self, spec: RequestSpec):
        return self.pb.GenerateRequest(
            request_id=spec.request_id, streaming=True, max_tokens=spec.max_tokens,
            ignore_eos=True,
            tokenized=self.pb.TokenizedInput(original_text=spec.text,
                                             input_token_ids=self.ids_of(spec)))

    def unhealthy(self, reply) -> str:
        return "" if reply.status == "OK" else f"{self.name} server is not healthy: {reply.status}"
