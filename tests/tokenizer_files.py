"""Small Hugging Face tokenizer files for tests (no hub: built here, from a word list)."""

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers


def write_word_tokenizer(path: Path, words: list[str]) -> Path:
    """A tokenizer.json with one token per word of `words`, split on whitespace."""
    vocab = {"[UNK]": 0} | {w: i + 1 for i, w in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path
