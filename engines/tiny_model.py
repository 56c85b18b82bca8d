"""The tiny Qwen3-MoE the engine tier serves from vLLM and from this project's server (README,
"Against a real vLLM"): a Hugging Face directory built here in a second, nothing downloaded.

    python -m engines.tiny_model DIR [--seed N]

It holds config.json (4 layers, hidden 256, 16 experts of 128, top-2, bfloat16), random weights
from the seed as model.safetensors (both servers load the same ones), and a byte-level BPE
tokenizer trained here on seeded text whose ids 0..255 are the 256 bytes, so the load
generator's synthetic prompts (token ids of printable ASCII, loadgen/traffic/workload.py) are
the text they spell, whichever server reads them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

VOCAB = 2048
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # the last ids of the vocabulary
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, num_experts=16, num_experts_per_tok=2,
             moe_intermediate_size=128, max_position_embeddings=2048)
MOE_SHAPE = "4x16x2"  # the load generator's --moe-shape for it: layers x experts x top-k
# a chat turn as Qwen's template writes it, so /v1/chat/completions works as on a real model
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def byte_chars() -> list[str]:
    """The printable character byte-level BPE writes for each byte 0..255 (GPT-2's map: the
    printable bytes stand for themselves, the rest are moved past 255)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, moved = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + moved)
            moved += 1
    return [chars[b] for b in range(256)]


def corpus(seed: int, words: int = 60_000) -> list[str]:
    """Seeded lines of made-up words, varied enough for every merge the vocabulary holds."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [26 - i for i in range(len(letters))]
    lexicon = ["".join(rng.choices(letters, weights, k=rng.randint(2, 9))) for _ in range(4000)]
    line = [rng.choice(lexicon) for _ in range(words)]
    return [" ".join(line[i:i + 40]) for i in range(0, words, 40)]


def write_tokenizer(directory: Path, seed: int) -> None:
    """tokenizer.json (VOCAB ids: the bytes, the merges learned here, SPECIALS last) and
    tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator(corpus(seed), trainer)
    learned = json.loads(trained.to_str())["model"]
    merged = sorted((i, t) for t, i in learned["vocab"].items() if len(t) > 1)
    vocab = {c: b for b, c in enumerate(byte_chars())}
    vocab |= {t: 256 + n for n, (_, t) in enumerate(merged)}
    if len(vocab) != VOCAB - len(SPECIALS):
        raise RuntimeError(f"the tokenizer learned {len(vocab)} tokens, not "
                           f"{VOCAB - len(SPECIALS)}: a larger corpus is needed")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in learned["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[0],
        "pad_token": SPECIALS[0], "model_max_length": SHAPE["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE}, indent=1))


def write_model(directory: Path, seed: int = 0) -> Path:
    """The model directory (made if missing); returns it."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    write_tokenizer(directory, seed)
    eos = VOCAB - len(SPECIALS)
    config = Qwen3MoeConfig(vocab_size=VOCAB, **SHAPE, norm_topk_prob=True,
                            decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                            rope_theta=1_000_000.0, tie_word_embeddings=False,
                            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engines.tiny_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0, help="of the weights and the tokenizer")
    args = parser.parse_args()
    print(write_model(args.directory, args.seed))


if __name__ == "__main__":
    main()
