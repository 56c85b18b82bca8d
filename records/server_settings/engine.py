"""The engine the server runs: the model, the batching, the MoE layers, expert parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import above, at_least
from records.declare import Names, Settings, require, setting


def _device(value: str | None) -> str | None:
    ok = value in (None, "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())
    return None if ok else f"must be cpu, cuda or cuda:N, got {value!r}"


@dataclass(frozen=True)
class Model(Settings):
    """Model"""

    preset: str = setting("small", "model shape, its weights random from --seed: tiny for tests, "
                          "small for CPU load tests (20-50 tokens/s per stream), fine for CPU "
                          "load tests with fine-grained experts (64, top-8, and a shared one); "
                          "the others are real models' shapes, for GPUs",
                          choices=Names("presets"))
    checkpoint: str = setting("", "serve this Hugging Face checkpoint directory instead of a "
                              "preset: config.json, *.safetensors (an index or not) and "
                              "tokenizer.json of a Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE or "
                              "OLMoE model (docs/checkpoints.md)", flag="model")
    # GetStats' max_seq_len is the context the model runs with, this or the model's own
    context_len: int = setting(0, "context per sequence, the positions the KV cache holds; 0 = "
                               "the model's (the preset's, or the checkpoint's "
                               "max_position_embeddings)", flag="max-seq-len",
                               check=at_least(0, note=" (0 = the model's)"))
    device: str | None = setting(None, "cpu, cuda or cuda:N; cuda when present", check=_device)
    dtype: str | None = setting(None, "float32, bfloat16 or float16; on cuda the checkpoint's own "
                                "or bfloat16; float32 on a cpu (bfloat16 is 10-70x slower "
                                "without AVX-512 and, with AVX512-BF16, no faster at decode "
                                "sizes: make bench-engine)", choices=Names("dtypes"))
    cuda_graphs: bool = setting(True, "on CUDA, run each step of only decoding sequences as a "
                                "CUDA graph captured at start-up per batch-size bucket (the batch "
                                "padded up to its bucket; docs/design.md, \"Decode graphs\"), "
                                "where the MoE kernel, router and attention allow it (the log "
                                "says why not); --no-cuda-graphs launches every kernel from "
                                "Python")
    gpu_sample_steps: int = setting(64, "on CUDA, time every N-th step's stages as GPU work, its "
                                    "kernels queued behind a sleep so no stage holds the host's "
                                    "launch gaps (docs/metrics.md, \"Stage times and GPU busy\"); "
                                    "such a step runs eagerly and takes about twice its time; "
                                    "0 = never (no stage times on CUDA)",
                                    check=at_least(0, note=" (0 = never)"))
    seed: int = setting(0, "seed of the random weights (nothing is downloaded); with --model, of "
                        "what the checkpoint does not hold (a noisy router's noise weights)")
    n_experts: int = setting(0, "experts per MoE layer instead of the preset's (its expert size "
                             "and top-k kept, so the active parameters per token stay the "
                             "same); 0 = the preset's; not with --model", flag="experts",
                             check=at_least(0, note=" (0 = the preset's)"))
    torch_threads: int = setting(0, "torch intra-op threads; 0 = torch's default (set 1 when "
                                 "server and load generator share 2 cores)", check=at_least(0))
    heap_trim_s: float = setting(10.0, "every this many seconds, between steps, the engine "
                                 "thread returns freed heap memory to the system (glibc "
                                 "malloc_trim): without it RSS creeps up under varied request "
                                 "sizes while the memory in use stays flat; 0 = never",
                                 check=at_least(0))


@dataclass(frozen=True)
class Batching(Settings):
    """Batching"""

    policy: str = setting("fcfs", "batching policy (the policies are described below)",
                          choices=Names("policies"), compared=False)
    max_batch_size: int = setting(32, "most requests in one engine step", check=at_least(1))
    kv_slots: int = setting(0, "sequences the preallocated KV cache pool holds; 0 = "
                            "--max-batch-size", check=at_least(0, note=" (0 = --max-batch-size)"))
    # The next two are policy knobs: they differ between policies by design.
    max_wait_ms: float = setting(50.0, "static, dynamic: longest wait for a batch to fill; "
                                 "expert_aware, prefix_aware: age bound", check=at_least(0),
                                 compared=False)
    max_step_tokens: int = setting(512, "latency_sensitive: tokens per step, decodes first, then "
                                   "prompt chunks", check=at_least(1), compared=False)
    max_prefill_tokens: int = setting(8192, "prompt tokens one step prefills, under every "
                                      "policy: the rest of a longer prompt, and the prompts after "
                                      "it, wait for the next steps (a step's activation memory "
                                      "grows with its prompt tokens)", check=at_least(1))
    prefix_cache: bool = setting(True, "reuse the KV of prompt prefixes already computed, by "
                                 "block, kept in the pool's free slots (docs/design.md, "
                                 "\"Prefix cache\"); --no-prefix-cache computes every prompt "
                                 "from its first token")
    prefix_block_tokens: int = setting(16, "tokens of one prefix-cache block: prefixes are "
                                       "reused in whole blocks", check=at_least(1))
    prefix_cache_tokens: int | None = setting(None, "most tokens the prefix cache keeps in free "
                                              "slots (least recently used forgotten first); "
                                              "default: the whole pool, --kv-slots x the "
                                              "context", check=at_least(1))


@dataclass(frozen=True)
class MoE(Settings):
    """MoE layer"""

    router: str = setting("topk", "topk (softmax in fp32, top-k, renormalised), noisy_topk "
                          "(Shazeer 2017: Gaussian noise scaled by a learned softplus term, "
                          "seeded), balanced (a least-loaded dispatcher: each "
                          "sequence's tokens in a step go to the k experts with the least load so "
                          "far in that step, from a heap; load resets every step), or a custom "
                          "module:Class", choices=Names("routers"))
    noise_scale: float = setting(1.0, "noise multiplier of noisy_topk", check=at_least(0))
    renormalize: bool | None = setting(None, "renormalise the top-k router weights to sum to 1 "
                                       "(Mixtral does, Qwen1.5-MoE does not); as the preset's "
                                       "model does when omitted")
    routing_skew: str = setting("uniform", "a logit bias on top of any router: uniform, zipf:S "
                                "(popularity ~ rank^-S, a different order per layer), hot:F (one "
                                "expert per layer gets fraction F of the routed slots, F <= 1/k), "
                                "affinity:ALPHA (each request draws its own Dirichlet(ALPHA) "
                                "preference from its id and seed: small ALPHA = strong, stable "
                                "affinity)", choices=Names("skews"))
    capacity_factor: float | None = setting(None, "each expert takes at most "
                                            "ceil(tokens x k / experts x CF) (token, expert) pairs "
                                            "per step; the rest are dropped (the token keeps its "
                                            "residual) and counted; dropless when omitted",
                                            check=lambda v: None if v is None or v > 0 else
                                            f"must be above 0 (omit it for dropless), got {v}")
    moe_kernel: str = setting("auto", "auto (on CUDA sorted, batched and grouped_mm, where its "
                              "probe passes in bfloat16, timed at start-up on the model's own "
                              "experts at decode and prefill sizes, each call then taking the "
                              "fastest for its size; sorted on the CPU and with the expert cache; "
                              "the log names the kernels and why), sorted (tokens sorted by "
                              "expert, one matmul chain per expert slice, one host sync per "
                              "layer), batched (every expert in one padded batched matmul chain, "
                              "a fixed number of GPU launches per layer, where no expert has over "
                              "64 tokens and at least half are in use; else as sorted), "
                              "grouped_mm (torch._grouped_mm; falls back to sorted with a logged "
                              "reason where the build, dtype, GPU or expert cache rule it out, or "
                              "its output differs from sorted's), or reference (per token, for "
                              "tests)", choices=Names("kernels"))
    expert_cache: int = setting(0, "keep at most N experts per layer resident (GPU memory on CUDA, "
                                "a separate buffer on CPU), the rest in host memory; misses copy "
                                "weights in for real; 0 = off",
                                check=at_least(0, note=" (0 = off)"))
    cache_policy: str = setting("lru", "expert-cache eviction: lru, lfu or random",
                                choices=Names("cache_policies"))


EP_COMMS = ("all-to-all", "allgather-reducescatter")
EP_PLACEMENTS = ("contiguous", "balanced")
EP_OVERLAPS = ("none", "two-batch")


@dataclass(frozen=True)
class Parallel(Settings):
    """Expert parallelism (docs/expert-parallelism.md)"""

    ep: int = setting(1, "ranks (processes) the engine runs as, on torch.distributed (gloo on a "
                      "CPU, NCCL on CUDA): experts spread over them, each rank's own sequences' "
                      "attention on it, an all-to-all per MoE layer; 1 = one process, no "
                      "communication", check=at_least(1))
    ep_comm: str = setting("all-to-all", "how tokens reach their experts' ranks: all-to-all "
                           "(each token's hidden state to the ranks of its experts and back) or "
                           "allgather-reducescatter (every rank gathers every token, computes "
                           "its experts' part and the sums are reduced back)", choices=EP_COMMS)
    ep_placement: str = setting("contiguous", "contiguous (rank r holds experts r E/N to "
                                "(r+1) E/N - 1) or balanced (by measured load, re-planned every "
                                "--ep-rebalance-steps steps, the hottest experts replicated "
                                "--ep-redundant times)", choices=EP_PLACEMENTS)
    ep_redundant: int = setting(0, "balanced: extra replicas of the hottest experts per layer",
                                check=at_least(0))
    ep_rebalance_steps: int = setting(200, "balanced: steps between placements, each from the "
                                      "load measured since the last", check=at_least(1))
    ep_overlap: str = setting("none", "none, or two-batch: each step's tokens in two "
                              "micro-batches so one's all-to-all runs while the other computes",
                              choices=EP_OVERLAPS)
    ep_timeout_s: float = setting(30.0, "longest wait for a rank in any collective; a rank gone "
                                  "or hung longer fails the step and stops the server",
                                  check=above(0), compared=False)
    link_gbps: float = setting(0.0, "model a link of this many Gbit/s between ranks: each "
                               "all-to-all's time as the slowest rank pair's latency + bytes / "
                               "bandwidth, reported beside the measured time; 0 = no model",
                               check=at_least(0))
    link_latency_us: float = setting(0.0, "the modelled link's latency per message",
                                     check=at_least(0))
    link_emulate: bool = setting(False, "make each all-to-all last at least its modelled time, so "
                                 "clients see a multi-node deployment's latency")

    def __post_init__(self):
        super().__post_init__()
        require(not self.link_emulate or self.link_gbps > 0, "link-emulate",
                "needs --link-gbps (the link to emulate)")
