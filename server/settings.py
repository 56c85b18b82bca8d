"""The server's side of its settings (declared in records/server_settings/): the names its
registries know, the checks that need the model or the device, and the values it resolves at
start-up (the device, dtype, KV slots and router normalisation a default leaves open).

`prepare` does all of it once, opening a checkpoint once, and hands the rest of the start-up a
`Startup`: the settings resolved, the model's shapes, the checkpoint."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass

import torch

from records.declare import Registry, SettingsError, argv_of, check_names, require
from records.server_settings import Model, ServerSettings
from server.engine import expert_cache, kernels, routers
from server.engine.checkpoint import Checkpoint, open_checkpoint
from server.engine.model_args import DTYPES, PRESETS, ModelArgs
from server.frontends.security import check_exposure, guard_of
from server.parallel.group import launched
from server.scheduling.policies import POLICIES, build_policy

REGISTRIES: dict[str, Registry] = {
    "presets": PRESETS,
    "dtypes": DTYPES,
    "routers": routers.router_class,
    "skews": routers.Skew.parse,
    "kernels": {"auto": None, **kernels.KERNELS},
    "cache_policies": expert_cache.POLICIES,
    "policies": POLICIES,
}


def device_problem(name: str) -> str | None:
    """Why torch cannot run on the device named, or None."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        return f"torch knows no device {name!r} ({str(e).splitlines()[0]})"
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "cuda requested but torch sees no CUDA device; use --device cpu"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"{name}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


@dataclass(frozen=True)
class Startup:
    """What the server starts from: its settings checked and resolved, the model's shapes, and
    with --model the checkpoint, opened once."""

    settings: ServerSettings  # resolved (see resolve)
    args: ModelArgs
    checkpoint: Checkpoint | None
    argv: list[str]  # the command line as given, for the ranks this process starts


def prepare(settings: ServerSettings, ports: bool = True) -> Startup:
    """Checks the settings (SettingsError naming the flag), opens the checkpoint, works out the
    shapes and resolves the defaults, each once. ports: the listeners are free (not for a rank
    that only follows rank 0)."""
    check_names(settings, REGISTRIES)
    model = settings.model
    require(settings.serving.http_port is not None or not settings.serving.http_port_file,
            "http-port-file", "needs --http-port (the HTTP API is off without it)")
    if model.device and (problem := device_problem(model.device)):
        raise SettingsError(f"--device: {problem}")
    require(not (model.checkpoint and model.n_experts), "experts",
            "sets a preset's expert count; a checkpoint has its own")
    checkpoint = open_checkpoint(model.checkpoint, model.context_len) if model.checkpoint else None
    args = checkpoint.args if checkpoint is not None else preset_args(model)
    check(settings, args, ports)
    return Startup(resolve(settings, args, checkpoint), args, checkpoint, argv_of(settings))


def check(settings: ServerSettings, args: ModelArgs, ports: bool) -> None:
    """What needs the model's shapes, or reaches outside the process."""
    moe = settings.moe
    try:
        routers.Skew.parse(moe.routing_skew).layer_bias(args.n_experts, args.top_k, 0, 0)
    except ValueError as e:
        raise SettingsError(f"--routing-skew: {e}") from None
    build_policy(settings.batching)  # a policy checks its own knobs
    check_prefix_cache(settings, args)
    check_parallel(settings, args)
    check_exposure(settings)
    guard_of(settings.security)  # the certificates and tokens can be read
    if ports:
        check_ports(settings)


def check_parallel(settings: ServerSettings, args: ModelArgs) -> None:
    """What expert parallelism needs of the model and the other settings."""
    p, moe = settings.parallel, settings.moe
    started = launched()
    require(started is None or started[1] == p.ep, "ep",
            f"is {p.ep} but torch.distributed's WORLD_SIZE is {started and started[1]}")
    if p.ep == 1:
        require(p.ep_placement == "contiguous" and not p.ep_redundant, "ep-placement",
                "places experts over ranks: needs --ep 2 or more")
        return
    slots = args.n_experts + (p.ep_redundant if p.ep_placement == "balanced" else 0)
    require(slots % p.ep == 0, "ep", f"{args.n_experts} experts"
            f"{f' + {p.ep_redundant} replicas' if p.ep_placement == 'balanced' else ''} do not "
            f"divide over {p.ep} ranks")
    require(not p.ep_redundant or p.ep_placement == "balanced", "ep-redundant",
            "replicas come with --ep-placement balanced")
    require(p.ep_overlap == "none" or p.ep_comm == "all-to-all", "ep-overlap",
            "two-batch overlaps the all-to-all exchanges: use it with --ep-comm all-to-all")
    require(moe.router == "topk", "router", "draws per step over the whole batch; with --ep "
            "each rank routes its own tokens, so only topk is supported")
    require(moe.capacity_factor is None, "capacity-factor", "counts each expert's tokens over "
            "the whole step; not supported with --ep (drop it: dropless)")
    require(not moe.expert_cache, "expert-cache", "not supported with --ep (each rank holds "
            "only its own experts already)")


def check_prefix_cache(settings: ServerSettings, args: ModelArgs) -> None:
    """Blocks fit the context, and the cache's cap the pool."""
    b = settings.batching
    require(b.prefix_block_tokens <= args.max_seq_len, "prefix-block-tokens",
            f"must be at most the context ({args.max_seq_len} tokens), got "
            f"{b.prefix_block_tokens}")
    pool = settings.kv_slots * args.max_seq_len
    require(b.prefix_cache_tokens is None or b.prefix_cache_tokens <= pool,
            "prefix-cache-tokens", f"must be at most the KV pool, --kv-slots "
            f"{settings.kv_slots} x {args.max_seq_len} context = {pool} tokens, got "
            f"{b.prefix_cache_tokens}")


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


def preset_args(model: Model) -> ModelArgs:
    """The preset's shapes, with --max-seq-len and --experts."""
    args = PRESETS[model.preset]
    changes = {"max_seq_len": model.context_len, "n_experts": model.n_experts}
    try:
        return dataclasses.replace(args, **{k: v for k, v in changes.items() if v})
    except ValueError as e:
        raise SettingsError(f"--experts: {e}") from None


def resolve(settings: ServerSettings, args: ModelArgs,
            checkpoint: Checkpoint | None) -> ServerSettings:
    """The settings with the defaults that depend on the machine or the model filled in, as
    the server runs them and GetStats reports them (no preset when it serves a checkpoint)."""
    model, batching, moe = settings.model, settings.batching, settings.moe
    device = model.device or ("cuda" if torch.cuda.is_available() else "cpu")
    own = next(name for name, kind in DTYPES.items()
               if kind == (checkpoint.dtype if checkpoint else torch.bfloat16))
    dtype = model.dtype or ("float32" if device == "cpu" else own)
    renormalize = args.renormalize if moe.renormalize is None else moe.renormalize
    preset = "" if checkpoint else model.preset
    return dataclasses.replace(
        settings, model=dataclasses.replace(model, preset=preset, device=device, dtype=dtype),
        batching=dataclasses.replace(batching, kv_slots=settings.kv_slots),
        moe=dataclasses.replace(moe, renormalize=renormalize))
