"""Server configuration: one frozen dataclass, validated once, with errors naming the flag."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from server import expert_cache, kernels, routing
from server.engine import EngineOptions
from server.model import PRESETS
from server.policies import POLICIES, PolicyConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ConfigError(ValueError):
    pass


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    port_file: str | None = None
    preset: str = "small"
    device: str = ""  # "" = cuda if present, else cpu
    dtype: str = ""  # "" = bfloat16 on cuda, float32 on cpu (bf16 is 10-70x slower on CPUs)
    seed: int = 0
    policy: str = "fcfs"
    max_batch_size: int = 32
    kv_slots: int = 0  # 0 = max_batch_size
    max_wait_ms: float = 50.0  # static/dynamic: longest wait for a batch; expert_aware: age bound
    max_step_tokens: int = 512  # latency_sensitive: token budget per step
    max_queue: int = 1024
    max_tokens_limit: int = 2048
    torch_threads: int = 0  # 0 = torch's default
    grace_s: float = 10.0
    router: str = "topk"
    noise_scale: float = 1.0
    renormalize: bool | None = None  # None = the preset's choice
    routing_skew: str = "uniform"
    capacity_factor: float | None = None  # None = dropless
    moe_kernel: str = "sorted"
    expert_cache: int = 0  # 0 = off
    cache_policy: str = "lru"
    metrics_port: int | None = None  # Prometheus /metrics; None = off, 0 = any free port
    step_log: str | None = None  # JSONL path, one line per engine step; None = off

    def __post_init__(self):
        def check(ok: bool, flag: str, message: str):
            if not ok:
                raise ConfigError(f"--{flag}: {message}")

        check(0 <= self.port <= 65535, "port", f"must be 0..65535 (0 = any free port), got {self.port}")
        check(self.preset in PRESETS, "preset", f"unknown {self.preset!r}; choose from {', '.join(PRESETS)}")
        args = PRESETS[self.preset]
        check(self.policy in POLICIES, "policy",
              f"unknown {self.policy!r}; choose from {', '.join(POLICIES)}")
        check(self.device in ("", "cpu", "cuda") or self.device.startswith("cuda:"), "device",
              f"must be cpu, cuda or cuda:N, got {self.device!r}")
        check(not self.device.startswith("cuda") or torch.cuda.is_available(), "device",
              "cuda requested but torch sees no CUDA device; use --device cpu")
        check(self.dtype in ("", *DTYPES), "dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check(self.max_batch_size >= 1, "max-batch-size", f"must be at least 1, got {self.max_batch_size}")
        check(self.max_wait_ms >= 0, "max-wait-ms", f"must be at least 0, got {self.max_wait_ms}")
        check(self.policy != "latency_sensitive" or self.max_step_tokens >= self.max_batch_size, "max-step-tokens",
              f"must be at least --max-batch-size ({self.max_batch_size}) so every running decode fits, "
              f"got {self.max_step_tokens}")
        check(self.kv_slots >= 0, "kv-slots", f"must be at least 1 (0 = --max-batch-size), got {self.kv_slots}")
        check(self.max_queue >= 1, "max-queue", f"must be at least 1, got {self.max_queue}")
        check(self.max_tokens_limit >= 1, "max-tokens-limit",
              f"must be at least 1, got {self.max_tokens_limit}")
        check(self.torch_threads >= 0, "torch-threads", f"must be at least 0, got {self.torch_threads}")
        check(self.grace_s >= 0, "grace-s", f"must be at least 0, got {self.grace_s}")
        try:
            routing.router_class(self.router)
        except ValueError as exc:
            check(False, "router", str(exc))
        check(self.noise_scale >= 0, "noise-scale", f"must be at least 0, got {self.noise_scale}")
        try:
            routing.Skew.parse(self.routing_skew).layer_bias(args.n_experts, args.top_k, 0, 0)
        except ValueError as exc:
            check(False, "routing-skew", str(exc))
        check(self.capacity_factor is None or self.capacity_factor > 0, "capacity-factor",
              f"must be above 0 (omit it for dropless), got {self.capacity_factor}")
        check(self.moe_kernel in kernels.KERNELS, "moe-kernel",
              f"unknown {self.moe_kernel!r}; choose from {', '.join(kernels.KERNELS)}")
        check(self.expert_cache >= 0, "expert-cache", f"must be at least 0 (0 = off), got {self.expert_cache}")
        check(self.metrics_port is None or 0 <= self.metrics_port <= 65535, "metrics-port",
              f"must be 0..65535 (0 = any free port), got {self.metrics_port}")
        check(self.cache_policy in expert_cache.POLICIES, "cache-policy",
              f"unknown {self.cache_policy!r}; choose from {', '.join(expert_cache.POLICIES)}")

    @property
    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(self.max_batch_size, self.max_wait_ms, self.max_step_tokens)

    @property
    def engine_options(self) -> EngineOptions:
        return EngineOptions(self.router, self.noise_scale, self.renormalize, self.routing_skew, self.capacity_factor,
                             self.moe_kernel, self.expert_cache, self.cache_policy)

    @property
    def resolved_device(self) -> str:
        return self.device or default_device()

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or ("float32" if self.resolved_device == "cpu" else "bfloat16")

    @property
    def resolved_kv_slots(self) -> int:
        return self.kv_slots or self.max_batch_size
