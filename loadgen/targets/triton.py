"""The `triton` target: Triton Inference Server's GRPCInferenceService.ModelStreamInfer, for
decoupled LLM models (the vLLM backend, TensorRT-LLM's ensemble or BLS model), through the
stubs of the `tritonclient` package.

One request is one ModelInferRequest on a stream of its own, its prompt as text in
--triton-input (synthetic prompts as the ASCII text of their ids), asking for an empty final
response so the end is always marked (`triton_final_response`). The vLLM backend gets its
sampling parameters as JSON (max_tokens, min_tokens, ignore_eos: exact lengths) and is asked for
`num_output_tokens` and `finish_reason` (backend r24.12+), so token counts are the server's;
TensorRT-LLM's model gets a max_tokens tensor and streams text only, counted by --tokenizer or
estimated (docs/metrics.md). No per-message server timing. Readiness: ServerReady and
ModelReady.
"""

from __future__ import annotations

import json
import struct

import grpc

from loadgen.targets.grpc_stream import GrpcTarget
from loadgen.targets.target import Chunk, MissingPackage, RequestSpec, TargetError
from records.load_settings import TargetSettings

try:
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc
except ImportError as exc:
    raise MissingPackage("the triton target needs the tritonclient package: "
                         f"pip install -e '.[targets]' ({exc})") from None

FINAL = "triton_final_response"


def bytes_tensor(items: list[bytes]) -> bytes:
    """Triton's BYTES serialisation: each element as a little-endian uint32 length, then it."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def bytes_items(raw: bytes) -> list[bytes]:
    items, at = [], 0
    while at + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, at)
        items.append(raw[at + 4:at + 4 + n])
        at += 4 + n
    return items


class TritonTarget(GrpcTarget):
    name = "triton"
    stub_class = pb_grpc.GRPCInferenceServiceStub
    required = ("model",)

    def __init__(self, settings: TargetSettings):
        super().__init__(settings)
        self.vllm = settings.triton_backend == "vllm"
        self.streams_text = not self.vllm

    def request(self, spec: RequestSpec) -> pb.ModelInferRequest:
        s, n = self.settings, spec.max_tokens
        if self.vllm:
            sampling = json.dumps({"max_tokens": n, "min_tokens": n, "ignore_eos": True})
            tensors = [(s.triton_input, "BYTES", [1], bytes_tensor([spec.text.encode()])),
                       ("stream", "BOOL", [1], b"\x01"),
                       ("sampling_parameters", "BYTES", [1], bytes_tensor([sampling.encode()])),
                       ("exclude_input_in_output", "BOOL", [1], b"\x01"),
                       ("return_num_output_tokens", "BOOL", [1], b"\x01"),
                       ("return_finish_reason", "BOOL", [1], b"\x01")]
        else:  # TensorRT-LLM's models batch: every tensor has a batch dimension
            tensors = [(s.triton_input, "BYTES", [1, 1], bytes_tensor([spec.text.encode()])),
                       ("max_tokens", "INT32", [1, 1], struct.pack("<i", n)),
                       ("stream", "BOOL", [1, 1], b"\x01")]
        request = pb.ModelInferRequest(
            model_name=s.model, id=spec.request_id,
            inputs=[pb.ModelInferRequest.InferInputTensor(name=name, datatype=kind, shape=shape)
                    for name, kind, shape, _ in tensors],
            raw_input_contents=[raw for *_, raw in tensors])
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        return request

    def call(self, stub, request, timeout_s: float, metadata: tuple):
        # a stream of one request: the server answers it, then ends the stream
        return stub.ModelStreamInfer(iter([request]), timeout=timeout_s, metadata=metadata)

    def chunk_of(self, msg: pb.ModelStreamInferResponse, seen: int) -> Chunk:
        if msg.error_message:
            raise TargetError("SERVER_ERROR", msg.error_message[:300])
        response = msg.infer_response
        outputs = {o.name: raw for o, raw in zip(response.outputs, response.raw_output_contents,
                                                 strict=False)}
        final = response.parameters[FINAL].bool_param if FINAL in response.parameters else False
        reason = b"".join(bytes_items(outputs.get("finish_reason", b""))).decode()
        reason = "" if reason == "None" else reason  # the vLLM backend's "not finished yet"
        text = b"".join(bytes_items(outputs.get(self.settings.triton_output, b"")))
        count = outputs.get("num_output_tokens", b"")
        tokens = struct.unpack_from("<I", count)[0] if len(count) >= 4 else 0
        decoded = text.decode(errors="replace")
        return Chunk(tokens=tokens, text="" if self.vllm else decoded,
                     history_text=decoded if self.vllm else "",
                     finish_reason=reason or ("stop" if final else ""))

    def probe(self, host: str) -> str:
        try:
            if not self.ask(host, "ServerReady", pb.ServerReadyRequest()).ready:
                return f"triton server at {host} is not ready"
            if not self.ask(host, "ModelReady",
                            pb.ModelReadyRequest(name=self.settings.model)).ready:
                return f"triton server at {host}: model {self.settings.model!r} is not ready"
        except grpc.RpcError as exc:
            return self.not_answering(host, exc)
        return ""
