"""A model's shape (ModelArgs), the presets the server names (--preset), and the
floating-point types it computes in (--dtype): what the engine's modules are built from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from server.engine.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int = VOCAB_SIZE
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    n_experts: int = 4
    top_k: int = 2
    expert_dim: int = 128
    max_seq_len: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    # router weights renormalised over the chosen k (Mixtral); Qwen1.5-MoE does not
    renormalize: bool = True
    head_dim: int = 0  # 0 = dim // n_heads (Qwen3-MoE sets its own)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2-MoE)
    out_bias: bool = False  # ... and on the output projection
    qk_norm: str = ""  # "head": RMSNorm of each head of q and k (Qwen3-MoE); "full": of the
    #                    whole q and k projections (OLMoE); "": none
    clip_qkv: float | None = None  # q, k and v clamped to +-this (OLMoE's option)
    shared_expert_dim: int = 0  # a SwiGLU every token passes, gated by sigmoid(x . g) (Qwen2-MoE)
    tie_embeddings: bool = False  # the output projection is the embedding matrix
    sliding_window: int = 0  # attend to at most this many latest positions (Mixtral); 0 = all

    def __post_init__(self):
        if not self.head_dim:
            if self.dim % self.n_heads:
                raise ValueError("dim must divide by n_heads (or give head_dim)")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must divide by n_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary halves), got {self.head_dim}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in 1..{self.n_experts}, got {self.top_k}")
        if self.qk_norm not in ("", "head", "full"):
            raise ValueError(f"qk_norm must be '', 'head' or 'full', got {self.qk_norm!r}")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


# The floating-point types the engine computes in, by the name --dtype and config.json use.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

PRESETS: dict[str, ModelArgs] = {
    # Tests: a decode step in about a millisecond on 2 CPU cores.
    "tiny": ModelArgs(),
    # CPU load tests: 20-50 tokens/s per stream, saturating around a batch of 8-16 streams.
    "small": ModelArgs(dim=768, n_layers=6, n_heads=12, n_kv_heads=4, n_experts=8, top_k=2,
                       expert_dim=1536, max_seq_len=1024),
    # CPU load tests with fine-grained experts (Qwen-MoE-like: many small experts, several per
    # token, and a shared one), so policies and the expert cache meet realistic expert counts: a
    # decode step of 8 streams takes tens of ms on 2 CPU cores, as small's does.
    "fine": ModelArgs(dim=512, n_layers=6, n_heads=8, n_kv_heads=4, n_experts=64, top_k=8,
                      expert_dim=256, shared_expert_dim=1024, max_seq_len=1024),
    # Real shapes, for GPUs.
    "mixtral-8x7b": ModelArgs(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                              n_experts=8, top_k=2, expert_dim=14336, max_seq_len=4096,
                              rope_base=1e6),
    "qwen1.5-moe-a2.7b": ModelArgs(vocab_size=151936, dim=2048, n_layers=24, n_heads=16,
                                   n_kv_heads=16, n_experts=60, top_k=4, expert_dim=1408,
                                   max_seq_len=4096, rope_base=1e6, renormalize=False,
                                   qkv_bias=True, shared_expert_dim=5632, norm_eps=1e-6),
    # Fine-grained experts: many small ones, several per token.
    "qwen3-30b-a3b": ModelArgs(vocab_size=151936, dim=2048, n_layers=48, n_heads=32,
                               n_kv_heads=4, head_dim=128, n_experts=128, top_k=8,
                               expert_dim=768, max_seq_len=4096, rope_base=1e6, qk_norm="head",
                               norm_eps=1e-6),
    "olmoe-1b-7b": ModelArgs(vocab_size=50304, dim=2048, n_layers=16, n_heads=16, n_kv_heads=16,
                             n_experts=64, top_k=8, expert_dim=1024, max_seq_len=4096,
                             qk_norm="full", renormalize=False),
}
