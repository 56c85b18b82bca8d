"""transformers' own MoE block on one of our layers' weights, for make bench-engine's reference
column: Mixtral's (top-k renormalised), Qwen2-MoE's (a shared expert) or Qwen3-MoE's (top-k
not renormalised), whichever has the layer's semantics. Its parameters are our tensors, not
copies: the block reads the same memory the layer does."""

from __future__ import annotations

from torch import Tensor, nn

from server.engine.moe import MoELayer

# transformers' experts implementations worth timing on a CPU; its batched_mm gathers a weight
# matrix per token and runs about 100x slower here (docs/measured.md)
IMPLEMENTATIONS = ("eager", "grouped_mm")


def reference_block(moe: MoELayer, renormalize: bool) -> nn.Module | None:
    """The transformers block computing what moe computes, on moe's weights; None without
    transformers."""
    try:
        import transformers
    except ImportError:
        return None
    e, two_i, d = moe.experts.w13.shape
    common = dict(hidden_size=d, num_experts_per_tok=moe.top_k)
    if moe.shared is not None:
        hidden = moe.shared.w2.weight.shape[1]
        config = transformers.Qwen2MoeConfig(**common, num_experts=e,
                                             moe_intermediate_size=two_i // 2,
                                             shared_expert_intermediate_size=hidden,
                                             norm_topk_prob=renormalize)
        block = transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config)
        gate, up = moe.shared.w13.weight.chunk(2, dim=0)
        block.shared_expert.gate_proj.weight = nn.Parameter(gate)
        block.shared_expert.up_proj.weight = nn.Parameter(up)
        block.shared_expert.down_proj.weight = moe.shared.w2.weight
        block.shared_expert_gate.weight = moe.shared.gate.weight
    elif renormalize:
        config = transformers.MixtralConfig(**common, num_local_experts=e,
                                            intermediate_size=two_i // 2)
        block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config)
    else:
        config = transformers.Qwen3MoeConfig(**common, num_experts=e,
                                             moe_intermediate_size=two_i // 2,
                                             norm_topk_prob=False)
        block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config)
    block.gate.weight = moe.router.gate.weight
    block.experts.gate_up_proj = moe.experts.w13
    block.experts.down_proj = moe.experts.w2
    block.config = config
    return block.eval()


def reference_forward(block: nn.Module, implementation: str, x: Tensor) -> Tensor:
    """The block's output for x [T, D] with transformers' experts implementation of that name."""
    block.experts.config._experts_implementation = implementation
    return block(x[None])[0]
