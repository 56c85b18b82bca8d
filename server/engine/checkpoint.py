"""Hugging Face checkpoints (--model DIR): config.json becomes ModelArgs, the safetensors
shards are read lazily (memory-mapped by `safetensors`, one tensor at a time) into the
model's parameters through one name table per architecture, and tokenizer.json becomes the
server's tokenizer.

Supported: Mixtral, Qwen2-MoE (Qwen1.5-MoE: its shared expert and sigmoid gate), Qwen3-MoE
and OLMoE, with experts stored one by one (w1/w3/w2 or gate/up/down_proj) or as transformers
5 keeps them fused (experts.gate_up_proj [E, 2I, D], experts.down_proj [E, D, I]). Anything
else is refused at start-up in one line naming the file, the tensor or the setting, and what
was expected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from records.declare import SettingsError
from records.jsonform import RecordError, read_object
from server.engine.model_args import DTYPES, ModelArgs
from server.engine.tokenizer import CheckpointTokenizer

INDEX = "model.safetensors.index.json"
FLOATS = {"F32", "F16", "BF16"}
IGNORED = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved
REFUSED = {
    "DeepseekV2ForCausalLM": "its multi-head latent attention (MLA) is not implemented here",
    "DeepseekV3ForCausalLM": "its multi-head latent attention (MLA) is not implemented here",
}


class CheckpointError(SettingsError):
    """The checkpoint cannot be served as it is; the message says where and what."""


@dataclass(frozen=True)
class Architecture:
    """One architecture: its config's names for our shapes, and its checkpoint's for our
    parameters."""

    moe: str  # the MoE block's module in the checkpoint, under model.layers.N
    experts: tuple[str, str, str]  # one expert's gate, up and down projections
    expert_dim: str  # the config key of an expert's hidden size
    args: Callable[[dict], dict]  # the config's family-specific ModelArgs fields


def _mixtral(c: dict) -> dict:
    return {"n_experts": c["num_local_experts"], "renormalize": True,
            "sliding_window": c.get("sliding_window") or 0}


def _qwen2_moe(c: dict) -> dict:
    _no_dense_layers(c)
    return {"n_experts": c["num_experts"], "renormalize": c.get("norm_topk_prob", False),
            "qkv_bias": c.get("qkv_bias", True),
            "shared_expert_dim": c.get("shared_expert_intermediate_size", 0),
            "sliding_window": c.get("sliding_window", 0) if c.get("use_sliding_window") else 0}


def _qwen3_moe(c: dict) -> dict:
    _no_dense_layers(c)
    return {"n_experts": c.get("num_experts", c.get("num_local_experts")),
            "renormalize": c.get("norm_topk_prob", True), "qk_norm": "head",
            "qkv_bias": c.get("attention_bias", False), "out_bias": c.get("attention_bias", False),
            "sliding_window": c.get("sliding_window", 0) if c.get("use_sliding_window") else 0}


def _olmoe(c: dict) -> dict:
    return {"n_experts": c["num_experts"], "renormalize": c.get("norm_topk_prob", False),
            "qk_norm": "full", "clip_qkv": c.get("clip_qkv"),
            "qkv_bias": c.get("attention_bias", False), "out_bias": c.get("attention_bias", False)}


def _no_dense_layers(c: dict) -> None:
    if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
        raise ValueError("dense (non-MoE) layers (mlp_only_layers, decoder_sparse_step) are "
                         "not supported")


PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
FAMILIES = {
    "MixtralForCausalLM": Architecture("block_sparse_moe", ("w1", "w3", "w2"), "intermediate_size",
                                       _mixtral),
    "Qwen2MoeForCausalLM": Architecture("mlp", PROJECTIONS, "moe_intermediate_size", _qwen2_moe),
    "Qwen3MoeForCausalLM": Architecture("mlp", PROJECTIONS, "moe_intermediate_size", _qwen3_moe),
    "OlmoeForCausalLM": Architecture("mlp", PROJECTIONS, "intermediate_size", _olmoe),
}
# transformers 5 names the MoE block `mlp` in every family when it saves experts fused
FUSED_MOE = "mlp"

# Where a checkpoint tensor goes: our parameter, the expert whose row of it (None: the whole
# parameter), and the projection whose rows of a fused weight (q, k, v; gate, up; None: all).
Place = tuple[str, int | str | None, str | None]


def table(family: Architecture, args: ModelArgs, names: set[str]) -> dict[str, Place]:
    """Checkpoint tensor name -> (our parameter, expert or None, projection part or None): the
    architecture's whole name map, per layer in the layout (one by one, or fused) the
    checkpoint holds."""
    out: dict[str, Place] = {"model.embed_tokens.weight": ("tok_embeddings.weight", None, None),
                             "model.norm.weight": ("norm.weight", None, None)}
    if not args.tie_embeddings:
        out["lm_head.weight"] = ("output.weight", None, None)
    for n in range(args.n_layers):
        ours, theirs = f"layers.{n}.", f"model.layers.{n}."
        attention = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v"}
        for name, part in attention.items():
            out[f"{theirs}{name}.weight"] = (f"{ours}attention.wqkv.weight", None, part)
            if args.qkv_bias:
                out[f"{theirs}{name}.bias"] = (f"{ours}attention.wqkv.bias", None, part)
        out[f"{theirs}self_attn.o_proj.weight"] = (f"{ours}attention.wo.weight", None, None)
        if args.out_bias:
            out[f"{theirs}self_attn.o_proj.bias"] = (f"{ours}attention.wo.bias", None, None)
        if args.qk_norm:
            for qk in "qk":
                out[f"{theirs}self_attn.{qk}_norm.weight"] = (f"{ours}attention.{qk}_norm.weight",
                                                               None, None)
        out[f"{theirs}input_layernorm.weight"] = (f"{ours}attention_norm.weight", None, None)
        out[f"{theirs}post_attention_layernorm.weight"] = (f"{ours}ffn_norm.weight", None, None)
        fused = f"{theirs}{FUSED_MOE}.experts.gate_up_proj" in names
        moe = f"{theirs}{FUSED_MOE if fused else family.moe}."
        experts = f"{ours}moe.experts."
        out[f"{moe}gate.weight"] = (f"{ours}moe.router.gate.weight", None, None)
        if fused:
            out[f"{moe}experts.gate_up_proj"] = (f"{experts}w13", None, None)
            out[f"{moe}experts.down_proj"] = (f"{experts}w2", None, None)
        else:
            gate, up, down = family.experts
            for e in range(args.n_experts):
                out[f"{moe}experts.{e}.{gate}.weight"] = (f"{experts}w13", e, "gate")
                out[f"{moe}experts.{e}.{up}.weight"] = (f"{experts}w13", e, "up")
                out[f"{moe}experts.{e}.{down}.weight"] = (f"{experts}w2", e, None)
        if args.shared_expert_dim:
            shared, ours_shared = f"{moe}shared_expert.", f"{ours}moe.shared."
            out[f"{shared}gate_proj.weight"] = (f"{ours_shared}w13.weight", None, "gate")
            out[f"{shared}up_proj.weight"] = (f"{ours_shared}w13.weight", None, "up")
            out[f"{shared}down_proj.weight"] = (f"{ours_shared}w2.weight", None, None)
            out[f"{moe}shared_expert_gate.weight"] = (f"{ours_shared}gate.weight", None, None)
    return out


def rows(args: ModelArgs, part: str | None, size: int) -> slice:
    """The rows of a fused weight that a projection fills: q, k, v of wqkv; gate, up of w13."""
    if part is None:
        return slice(None)
    q, kv = args.q_dim, args.kv_dim
    starts = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv),
              "gate": (0, size // 2), "up": (size // 2, size)}
    return slice(*starts[part])


class Shards:
    """The checkpoint's tensors by name, opened lazily: safetensors memory-maps each file and
    reads a tensor when asked for it."""

    def __init__(self, directory: Path):
        self.directory = directory
        index = directory / INDEX
        if index.exists():
            weight_map = _json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"--model: {index}: no weight_map")
            self.file_of = {name: directory / file for name, file in weight_map.items()}
            for file in sorted(set(self.file_of.values())):
                if not file.exists():
                    raise CheckpointError(f"--model: {file} is missing ({INDEX} lists it)")
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"--model: no *.safetensors files in {directory}")
            self.file_of = {name: file for file in files for name in self._open(file).keys()}
        self._handles: dict[Path, object] = {}

    def _open(self, file: Path):
        try:
            return safe_open(str(file), framework="pt", device="cpu")
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"--model: {file}: not a readable safetensors file: "
                                  f"{exc}") from None

    def handle(self, name: str):
        file = self.file_of[name]
        if file not in self._handles:
            self._handles[file] = self._open(file)
        return self._handles[file]

    def get(self, name: str) -> torch.Tensor:
        handle = self.handle(name)
        kind = handle.get_slice(name).get_dtype()
        if kind not in FLOATS:
            raise CheckpointError(f"--model: tensor {name} in {self.file_of[name].name} is "
                                  f"{kind}; expected a floating-point type "
                                  f"({', '.join(sorted(FLOATS))})")
        return handle.get_tensor(name)


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    architecture: str
    family: Architecture
    args: ModelArgs
    dtype: torch.dtype  # the weights' own (config's torch_dtype)
    eos_ids: frozenset[int]

    def tokenizer(self) -> CheckpointTokenizer:
        return CheckpointTokenizer(self.directory / "tokenizer.json", self.eos_ids)

    @torch.no_grad()
    def load_into(self, model: torch.nn.Module) -> frozenset[str]:
        """Copies every tensor of the checkpoint into model (cast to its dtype); returns the
        parameters it filled. Refuses a missing, unexpected or misshapen tensor by name."""
        shards = Shards(self.directory)
        names = set(shards.file_of)
        places = table(self.family, self.args, names)
        missing = sorted(set(places) - names)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CheckpointError(f"--model: tensor {missing[0]} is missing from "
                                  f"{self.directory}{more}; does config.json match the weights?")
        tied = {"lm_head.weight"} if self.args.tie_embeddings else set()  # a copy of the embedding
        extra = sorted(n for n in names - set(places) - tied if not n.endswith(IGNORED))
        if extra:
            raise CheckpointError(f"--model: unexpected tensor {extra[0]} in "
                                  f"{shards.file_of[extra[0]].name}; config.json says "
                                  f"{self.architecture} with {self.args.n_layers} layers and "
                                  f"{self.args.n_experts} experts")
        params = dict(model.named_parameters())
        for name, (param, expert, part) in places.items():
            held = held_experts(model, param)  # the experts this process holds, in its slots
            if expert is not None and held is not None and expert not in held:
                continue  # another rank's
            target = params[param]
            if expert is not None:
                target = target[expert if held is None else held.index(expert)]
            target = target[rows(self.args, part, target.shape[0])]
            tensor = shards.get(name)
            if held is not None and expert is None:  # experts fused: this process's rows
                wanted = [self.args.n_experts, *target.shape[1:]]
                if list(tensor.shape) != wanted:
                    raise CheckpointError(f"--model: tensor {name} in "
                                          f"{shards.file_of[name].name} has shape "
                                          f"{list(tensor.shape)}; config.json asks for {wanted}")
                tensor = tensor[held]
            if tuple(tensor.shape) != tuple(target.shape):
                raise CheckpointError(f"--model: tensor {name} in {shards.file_of[name].name} "
                                      f"has shape {list(tensor.shape)}; config.json asks for "
                                      f"{list(target.shape)}")
            target.copy_(tensor)
        return frozenset(param for param, _, _ in places.values())

    @torch.no_grad()
    def expert(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's weights, w13 [2I, D] and w2 [D, I] (a process taking it over)."""
        shards = Shards(self.directory)
        places = table(self.family, self.args, set(shards.file_of))
        i = self.args.expert_dim
        w13 = torch.empty(2 * i, self.args.dim)
        w2 = torch.empty(self.args.dim, i)
        experts = f"layers.{layer}.moe.experts."
        for name, (param, e, part) in places.items():
            if not param.startswith(experts) or e not in (expert, None):
                continue
            tensor = shards.get(name)
            tensor = tensor[expert] if e is None else tensor
            target = w13 if param.endswith("w13") else w2
            target[rows(self.args, part, target.shape[0])].copy_(tensor)
        return w13, w2


def held_experts(model: torch.nn.Module, param: str) -> list[int] | None:
    """The experts in the slots of an experts parameter (layers.N.moe.experts.*) when the
    model holds only some of them (spread over ranks); None for any other parameter, or when
    it holds them all in order."""
    if ".moe.experts." not in param:
        return None
    layer = int(param.split(".")[1])
    held = model.layers[layer].moe.experts.held
    return None if held == list(range(len(held))) and len(held) == model.args.n_experts \
        else held


def open_checkpoint(path: str, max_seq_len: int = 0) -> Checkpoint:
    """The checkpoint in directory `path`, its config read and checked (the weights are read
    by load_into); max_seq_len above 0 caps the context."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"--model: {path} is not a directory")
    config = _json(directory / "config.json")
    archs = config.get("architectures") or [config.get("model_type", "")]
    arch = archs[0] if isinstance(archs, list) and archs else str(archs)
    supported = ", ".join(FAMILIES)
    if arch in REFUSED:
        raise CheckpointError(f"--model: {arch} ({directory / 'config.json'}): {REFUSED[arch]}; "
                              f"supported: {supported}")
    if arch not in FAMILIES:
        raise CheckpointError(f"--model: architecture {arch!r} ({directory / 'config.json'}) is "
                              f"not supported; supported: {supported}")
    family = FAMILIES[arch]
    try:
        args = model_args(config, family, max_seq_len)
    except (KeyError, TypeError, ValueError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise CheckpointError(f"--model: {directory / 'config.json'}: {what}") from None
    if not (directory / "tokenizer.json").exists():
        raise CheckpointError(f"--model: {directory / 'tokenizer.json'} is missing; the server "
                              "needs the checkpoint's own tokenizer (tokenizer.json)")
    dtype_name = config.get("torch_dtype") or config.get("dtype") or "float32"
    if dtype_name not in DTYPES:
        raise CheckpointError(f"--model: {directory / 'config.json'}: dtype {dtype_name!r}; "
                              f"expected one of {', '.join(DTYPES)}")
    return Checkpoint(directory, arch, family, args, DTYPES[dtype_name],
                      eos_of(directory, config, args.vocab_size))


def model_args(c: dict, family: Architecture, max_seq_len: int) -> ModelArgs:
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {c['hidden_act']!r}; only silu (SwiGLU experts) is supported")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type', rope.get('type'))!r} is not "
                         "supported; only the default rotary embedding")
    context = c.get("max_position_embeddings", 4096)
    return ModelArgs(
        vocab_size=c["vocab_size"], dim=c["hidden_size"], n_layers=c["num_hidden_layers"],
        n_heads=c["num_attention_heads"],
        n_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        head_dim=c.get("head_dim") or 0, top_k=c["num_experts_per_tok"],
        expert_dim=c[family.expert_dim], max_seq_len=min(context, max_seq_len or context),
        rope_base=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        norm_eps=c.get("rms_norm_eps", 1e-5), tie_embeddings=c.get("tie_word_embeddings", False),
        **family.args(c))


def eos_of(directory: Path, config: dict, vocab_size: int) -> frozenset[int]:
    """The end-of-sequence ids: generation_config.json's, else config.json's (an id or a list);
    ids outside the vocabulary can never be generated and are left out."""
    generation = directory / "generation_config.json"
    eos = _json(generation).get("eos_token_id") if generation.exists() else None
    eos = config.get("eos_token_id") if eos is None else eos
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    return frozenset(i for i in ids if isinstance(i, int) and 0 <= i < vocab_size)


def _json(path: Path) -> dict:
    try:
        return read_object(path)
    except RecordError as e:
        raise CheckpointError(f"--model: {e}") from None
