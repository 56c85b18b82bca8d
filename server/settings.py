"""The server's side of its settings (declared in records/server_settings.py): the names its
registries know, the checks that need the model or the device, and the values it resolves at
start-up (the device, dtype, KV slots and router normalisation a default leaves open)."""

from __future__ import annotations

import dataclasses
import socket

import torch

from records.declare import Registry, SettingsError, check_names, require
from records.server_settings import Model, ServerSettings
from server import expert_cache, kernels, routing
from server.checkpoint import open_checkpoint
from server.model import PRESETS, ModelArgs
from server.policies import POLICIES, build_policy
from server.security import check_exposure, guard_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

REGISTRIES: dict[str, Registry] = {
    "presets": PRESETS,
    "dtypes": DTYPES,
    "routers": routing.router_class,
    "skews": routing.Skew.parse,
    "kernels": kernels.KERNELS,
    "cache_policies": expert_cache.POLICIES,
    "policies": POLICIES,
}


def check(settings: ServerSettings) -> None:
    """Everything the declaration cannot check alone; raises SettingsError naming the flag."""
    check_names(settings, REGISTRIES)
    model, moe = settings.model, settings.moe
    require(settings.serving.http_port is not None or not settings.serving.http_port_file,
            "http-port-file", "needs --http-port (the HTTP API is off without it)")
    require(not (model.device or "").startswith("cuda") or torch.cuda.is_available(), "device",
            "cuda requested but torch sees no CUDA device; use --device cpu")
    args = model_args(model)
    try:
        routing.Skew.parse(moe.routing_skew).layer_bias(args.n_experts, args.top_k, 0, 0)
    except ValueError as e:
        raise SettingsError(f"--routing-skew: {e}") from None
    build_policy(settings.batching)  # a policy checks its own knobs
    check_exposure(settings)
    guard_of(settings.security)  # the certificates and tokens can be read
    check_ports(settings)


def listeners(settings: ServerSettings) -> list[tuple[str, str, int]]:
    """(flag, host, port) of every listener the settings ask for."""
    serving = settings.serving
    out = [("port", serving.host, serving.port)]
    if serving.metrics_port is not None:
        out.append(("metrics-port", settings.security.metrics_host or serving.host,
                    serving.metrics_port))
    if serving.http_port is not None:
        out.append(("http-port", serving.host, serving.http_port))
    return out


def check_ports(settings: ServerSettings) -> None:
    """Every port the server will listen on is free, before the model is built: a busy one is
    one line naming its flag (gRPC would otherwise share it with the server already there)."""
    seen: dict[int, str] = {}
    for flag, host, port in listeners(settings):
        if port and port in seen:
            raise SettingsError(f"--{flag}: {port} is also --{seen[port]}; give each its own port")
        seen[port] = flag
        if port:
            try_bind(flag, host, port)


def try_bind(flag: str, host: str, port: int) -> None:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            probe.bind(address)
    except OSError as exc:
        raise SettingsError(f"--{flag}: cannot listen on {host}:{port}: "
                            f"{exc.strerror or exc}; another server may be running there: stop "
                            f"it, or pick another --{flag} (0 = any free port)") from None


def model_args(model: Model) -> ModelArgs:
    """The shapes the server builds: the preset's, or the checkpoint's (its config read and
    checked; the weights are read when the engine is built)."""
    if model.checkpoint:
        return open_checkpoint(model.checkpoint, model.context_len).args
    args = PRESETS[model.preset]
    return dataclasses.replace(args, max_seq_len=model.context_len) if model.context_len else args


def resolve(settings: ServerSettings) -> ServerSettings:
    """The settings with the defaults that depend on the machine or the model filled in, as
    the server runs them and GetStats reports them (no preset when it serves a checkpoint)."""
    model, batching, moe = settings.model, settings.batching, settings.moe
    device = model.device or ("cuda" if torch.cuda.is_available() else "cpu")
    checkpoint = open_checkpoint(model.checkpoint) if model.checkpoint else None
    args = model_args(model)
    own = next(name for name, kind in DTYPES.items()
               if kind == (checkpoint.dtype if checkpoint else torch.bfloat16))
    dtype = model.dtype or ("float32" if device == "cpu" else own)
    renormalize = args.renormalize if moe.renormalize is None else moe.renormalize
    preset = "" if checkpoint else model.preset
    return dataclasses.replace(
        settings, model=dataclasses.replace(model, preset=preset, device=device, dtype=dtype),
        batching=dataclasses.replace(batching, kv_slots=settings.kv_slots),
        moe=dataclasses.replace(moe, renormalize=renormalize))
