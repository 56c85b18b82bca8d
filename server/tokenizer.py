"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, then the special tokens.

Models with a larger vocabulary (the real-shape presets) can emit ids past the specials;
those have no text and decode to nothing, but still count as tokens.
"""

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


def encode(text: str) -> list[int]:
    """BOS followed by the UTF-8 bytes of text."""
    return [BOS_ID, *text.encode("utf-8")]


def token_bytes(ids: list[int]) -> bytes:
    """The bytes of the byte tokens among ids; specials and unknown ids have none."""
    return bytes(i for i in ids if i < 256)
