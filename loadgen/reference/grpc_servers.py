"""The gRPC reference servers of loadgen/delay_server.py: moe.v1 (with GetStats and the standard
health service), the vLLM, SGLang and TensorRT-LLM engine services (smg-grpc-proto's stubs) and
Triton's ModelStreamInfer (tritonclient's stubs), each streaming the Pacer's schedule in its
own messages. Faults: `abort` (INTERNAL after the first message), `no-final` (the stream ends
without its final message).
"""

from __future__ import annotations

import importlib
import json
import struct
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from loadgen.reference.pacer import Pacer
from proto import moe_pb2, moe_pb2_grpc

TOKEN = 65  # every token is "A"
WORD = b"tok "  # a text protocol's token: one word, 4 characters


async def paced(pacer: Pacer, max_tokens: int, context, prompt=()):
    """The schedule's messages, with the stream's fault: an abort after the first message, or
    an end without the final one. prompt: the request's token ids, for the tally."""
    fault = pacer.fault()
    async for m in pacer.messages(max_tokens, prompt):
        if fault == "no-final" and m.last:
            return
        yield m
        if fault == "abort":
            await context.abort(grpc.StatusCode.INTERNAL, "delay server: an injected fault")


class MoeServicer(moe_pb2_grpc.MoEInferenceServicer):
    def __init__(self, pacer: Pacer):
        self.pacer = pacer

    async def Generate(self, request, context):
        async for m in paced(self.pacer, request.max_tokens, context,
                             request.prompt_token_ids or request.prompt.split()):
            msg = moe_pb2.GenerateResponse(token_ids=[TOKEN] * m.tokens, text="A" * m.tokens,
                                           server_elapsed_us=m.elapsed_us)
            if m.last:
                msg.finish_reason = moe_pb2.GenerateResponse.LENGTH
                msg.usage.prompt_tokens = len(request.prompt_token_ids) or len(request.prompt)
                msg.usage.completion_tokens = request.max_tokens
            yield msg

    async def GetStats(self, request, context):
        return moe_pb2.EngineStats(policy="delay", requests_finished=self.pacer.finished,
                                   uptime_s=time.monotonic() - self.pacer.started)


def engine_servicer(protocol: str, pacer: Pacer):
    """The servicer of one engine protocol, as the engines answer: chunks of token ids, then a
    complete message with every output id, the finish reason and the counts."""
    module = {"vllm-grpc": "vllm_engine", "sglang-grpc": "sglang_scheduler",
              "trtllm-grpc": "trtllm_service"}[protocol]
    pb = importlib.import_module(f"smg_grpc_proto.generated.{module}_pb2")
    pb_grpc = importlib.import_module(f"smg_grpc_proto.generated.{module}_pb2_grpc")
    service = pb.DESCRIPTOR.services_by_name
    name = next(iter(service))

    def asked(request) -> tuple[int, list[int]]:
        """(max tokens, prompt token ids) of a request."""
        if protocol == "vllm-grpc":
            return request.sampling_params.max_tokens, list(request.tokenized.input_ids)
        if protocol == "sglang-grpc":
            return request.sampling_params.max_new_tokens, list(request.tokenized.input_ids)
        return request.max_tokens, list(request.tokenized.input_token_ids)

    class Servicer(getattr(pb_grpc, f"{name}Servicer")):
        async def Generate(self, request, context):
            max_tokens, prompt = asked(request)
            ids = "output_token_ids" if protocol == "trtllm-grpc" else "output_ids"
            done = 0
            async for m in paced(pacer, max_tokens, context, prompt):
                done += m.tokens
                counts = {"prompt_tokens": len(prompt), "completion_tokens": done}
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(
                    token_ids=[TOKEN] * m.tokens, **counts))
                if m.last:
                    yield pb.GenerateResponse(complete=pb.GenerateComplete(
                        finish_reason="length", **{ids: [TOKEN] * max_tokens}, **counts))

        async def HealthCheck(self, request, context):
            if protocol == "trtllm-grpc":
                return pb.HealthCheckResponse(status="OK")
            return pb.HealthCheckResponse(healthy=True, message="delay server")

    return Servicer(), getattr(pb_grpc, f"add_{name}Servicer_to_server")


def bytes_tensor(item: bytes) -> bytes:
    return struct.pack("<I", len(item)) + item


def triton_servicer(pacer: Pacer):
    """Triton's stream, as its vLLM backend answers (sampling_parameters in the request: text,
    num_output_tokens and finish_reason on every response, the last marked final) or as
    TensorRT-LLM's models do (a max_tokens tensor: text only, then an empty final response)."""
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    def asked(request) -> tuple[int, bool]:
        """(max tokens, the vLLM backend's shape) of a request."""
        raw = dict(zip([i.name for i in request.inputs], request.raw_input_contents,
                       strict=True))
        if "sampling_parameters" in raw:
            return json.loads(raw["sampling_parameters"][4:])["max_tokens"], True
        return struct.unpack("<i", raw["max_tokens"])[0], False

    def response(request, outputs, final: bool):
        r = pb.ModelInferResponse(model_name=request.model_name, id=request.id,
                                  outputs=[pb.ModelInferResponse.InferOutputTensor(
                                      name=n, datatype=t, shape=[1]) for n, t, _ in outputs],
                                  raw_output_contents=[raw for *_, raw in outputs])
        r.parameters["triton_final_response"].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=r)

    class Servicer(pb_grpc.GRPCInferenceServiceServicer):
        async def ModelStreamInfer(self, request_iterator, context):
            async for request in request_iterator:
                max_tokens, vllm = asked(request)
                async for m in paced(pacer, max_tokens, context):
                    outputs = [("text_output", "BYTES", bytes_tensor(WORD * m.tokens))]
                    if vllm:
                        reason = b"length" if m.last else b"None"
                        outputs += [("num_output_tokens", "UINT32", struct.pack("<I", m.tokens)),
                                    ("finish_reason", "BYTES", bytes_tensor(reason))]
                    yield response(request, outputs, final=vllm and m.last)
                    if m.last and not vllm:
                        yield response(request, [], final=True)

        async def ServerReady(self, request, context):
            return pb.ServerReadyResponse(ready=True)

        async def ModelReady(self, request, context):
            return pb.ModelReadyResponse(ready=True)

    return Servicer(), pb_grpc.add_GRPCInferenceServiceServicer_to_server


async def start(protocol: str, pacer: Pacer):
    """The server started on its loopback port (--port; 0: any free one): (port, its stop)."""
    server = grpc.aio.server()
    if protocol == "moe":
        moe_pb2_grpc.add_MoEInferenceServicer_to_server(MoeServicer(pacer), server)
        if pacer.args.health:  # --no-health: a moe.v1 server without the standard service
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            service = moe_pb2.DESCRIPTOR.services_by_name["MoEInference"].full_name
            for name in ("", service):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    else:
        servicer, add = (triton_servicer(pacer) if protocol == "triton"
                         else engine_servicer(protocol, pacer))
        add(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{pacer.args.port}")
    await server.start()
    return port, lambda: server.stop(0)
