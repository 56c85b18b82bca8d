"""Tokenizers: the byte-level one of the random presets, and a checkpoint's own (its
tokenizer.json, through the `tokenizers` package) for --model.

Each encodes text to ids and decodes a stream of ids incrementally: a decoder returns whole
characters only, holding back the bytes of a character a token boundary split until the token
that completes it arrives.

The byte-level tokenizer: ids 0..255 are UTF-8 bytes, then the special tokens. Models with a
larger vocabulary (the real-shape presets) can emit ids past the specials; those have no text
and decode to nothing, but still count as tokens.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from tokenizers import Tokenizer as Vocabulary

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


def token_bytes(ids: list[int]) -> bytes:
    """The bytes of the byte tokens among ids; specials and unknown ids have none."""
    return bytes(i for i in ids if i < 256)


class ByteDecoder:
    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, ids: list[int]) -> str:
        return self._utf8.decode(token_bytes(ids))

    def flush(self) -> str:
        """What is held back when the stream ends (a cut character, as U+FFFD)."""
        return self._utf8.decode(b"", final=True)


class ByteTokenizer:
    eos_ids = frozenset({EOS_ID})

    def encode(self, text: str) -> list[int]:
        """BOS followed by the UTF-8 bytes of text."""
        return [BOS_ID, *text.encode("utf-8")]

    def fewest_tokens(self, text: str) -> int:
        """A bound on len(encode(text)) without encoding it: every character is a byte or more."""
        return len(text) + 1

    def decoder(self) -> ByteDecoder:
        return ByteDecoder()


class StreamDecoder:
    """A checkpoint tokenizer's incremental decoding, special tokens left out of the text. New
    text is the decoding of the ids since an earlier boundary minus that of the ids before the
    last emission, so a tokenizer that drops a word's leading space at the start of a text (or
    a byte-level one mid-character) changes both alike; text ending in U+FFFD waits for more."""

    def __init__(self, tokenizer: Vocabulary):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] decoded to the text last emitted after its start
        self._read = 0

    def _text(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)

    def _new(self) -> str:
        return self._text(self._prefix)[len(self._text(self._prefix, self._read)):]

    def decode(self, ids: list[int]) -> str:
        out = []
        for i in ids:
            self._ids.append(i)
            new = self._new()
            if new and not new.endswith("\ufffd"):
                out.append(new)
                self._prefix, self._read = self._read, len(self._ids)
        return "".join(out)

    def flush(self) -> str:
        """What is held back when the stream ends (a cut character, as U+FFFD)."""
        new = self._new()
        self._prefix = self._read = len(self._ids)
        return new


class CheckpointTokenizer:
    """A checkpoint's tokenizer.json; eos_ids from its config (generation_config.json first)."""

    def __init__(self, path: Path, eos_ids: frozenset[int]):
        self._tokenizer = Vocabulary.from_file(str(path))
        self.eos_ids = eos_ids

    def encode(self, text: str) -> list[int]:
        """The ids of text, with the special tokens the tokenizer's template adds (a BOS)."""
        return self._tokenizer.encode(text).ids

    def fewest_tokens(self, text: str) -> int:
        """A subword tokenizer may merge any number of characters into one token."""
        return 1 if text else 0

    def decoder(self) -> StreamDecoder:
        return StreamDecoder(self._tokenizer)


Tokenizer = ByteTokenizer | CheckpointTokenizer
