"""Tiny Hugging Face checkpoints for tests, built here with transformers (nothing downloaded):
one per supported architecture, a few MB each, with a byte-level BPE tokenizer trained on a
short text so prompts, BOS and split UTF-8 characters are real."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB = 320
BOS, EOS = "<s>", "</s>"
CORPUS = ["the experts route every token to the best of their kind",
          "mixture of experts models serve many requests at once",
          "héllo wörld, naïve café: ünïcödé text for the tokenizer"] * 20
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
              # larger than transformers' 0.02, so routers choose decisively and logits differ
              initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False)


# the families tests build, by name (transformers, imported only to build them, takes seconds)
ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def architectures():
    """name -> (config class, model class, config fields beyond COMMON), for ARCHITECTURES."""
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )
    families = {
        "mixtral": (MixtralConfig, MixtralForCausalLM,
                    dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48,
                         sliding_window=6)),
        "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM,
                      dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, norm_topk_prob=False,
                           intermediate_size=96)),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                      dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                           head_dim=24, norm_topk_prob=True, intermediate_size=96)),
        "olmoe": (OlmoeConfig, OlmoeForCausalLM,
                  dict(num_experts=4, num_experts_per_tok=2, intermediate_size=48,
                       clip_qkv=3.0)),
    }
    assert tuple(families) == ARCHITECTURES
    return families


def write_bpe_tokenizer(path: Path) -> Tokenizer:
    """A byte-level BPE tokenizer of VOCAB ids (0 pad, 1 BOS, 2 EOS) that adds BOS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A",
                                                             special_tokens=[(BOS, 1)])
    tokenizer.save(str(path))
    return tokenizer


def write_checkpoint(directory: Path, name: str, seed: int = 0, fused: bool = False,
                     dtype: torch.dtype = torch.float32):
    """The architecture's tiny model saved to directory (experts one by one as transformers
    saves them, or fused as it holds them in memory), with its tokenizer; returns the model."""
    config_class, model_class, fields = architectures()[name]
    torch.manual_seed(seed)
    model = model_class(config_class(**COMMON, **fields)).to(dtype).eval()
    model.save_pretrained(directory)
    if fused:  # the in-memory layout: experts.gate_up_proj, experts.down_proj
        for old in directory.glob("*.safetensors"):
            old.unlink()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"))
    write_bpe_tokenizer(directory / "tokenizer.json")
    return model


def shard(directory: Path) -> None:
    """Splits model.safetensors into two shards and an index, as large checkpoints are saved."""
    from safetensors.torch import load_file

    state = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, str(directory / file))
        weight_map |= dict.fromkeys(part, file)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
