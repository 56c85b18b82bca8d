"""Token counts for protocols whose messages carry text only (docs/metrics.md, "Counting tokens").

Once a stream has ended, its messages' texts become per-message token counts, by the first
rule that applies:
1. --tokenizer (a Hugging Face tokenizer.json): the whole output is encoded once and each
   token counts in the message where its last character arrived;
2. the server's own total (usage.completion_tokens): every message with text gets one token
   and the rest are spread in proportion to the messages' characters;
3. neither: one token per 4 characters of a message, at least one per message with text.
A message left with no token merges into the next (TTFT is the first message with a token).
"""

from __future__ import annotations

import bisect
import itertools

CHARS_PER_TOKEN = 4  # rule 3's estimate, the usual figure for English text and BPE vocabularies


class TextCounter:
    def __init__(self, tokenizer_path: str = ""):
        self.tokenizer = None
        if tokenizer_path:
            from tokenizers import Tokenizer  # only runs that count text pay for the import

            self.tokenizer = Tokenizer.from_file(tokenizer_path)
        self.path = tokenizer_path

    @property
    def how(self) -> str:
        """How the counts came about, for the run's warnings."""
        if self.tokenizer is not None:
            return f"output tokens counted from the streamed text with --tokenizer {self.path}"
        return ("output tokens per message estimated from the streamed text: the server's total "
                "(usage) spread over the messages by their characters, or without usage "
                f"{CHARS_PER_TOKEN} characters a token; give --tokenizer for exact counts")

    def __call__(self, texts: list[str], usage: dict[str, int]) -> list[int]:
        """The tokens in each message whose text is texts[i]."""
        if self.tokenizer is not None:
            return self._tokenized(texts)
        total = usage.get("completion_tokens", 0)
        with_text = sum(1 for t in texts if t)
        if total >= with_text > 0:
            base = [1 if t else 0 for t in texts]
            return [b + s for b, s in zip(base, _spread(total - with_text, texts), strict=True)]
        return [max(1, round(len(t) / CHARS_PER_TOKEN)) if t else 0 for t in texts]

    def _tokenized(self, texts: list[str]) -> list[int]:
        ends = list(itertools.accumulate(len(t) for t in texts))  # message i ends before ends[i]
        encoding = self.tokenizer.encode("".join(texts), add_special_tokens=False)
        counts = [0] * len(texts)
        for _, end in encoding.offsets:
            counts[min(bisect.bisect_left(ends, end), len(texts) - 1)] += 1
        return counts


def _spread(total: int, texts: list[str]) -> list[int]:
    """total split over the messages in proportion to their characters, summing exactly."""
    chars = list(itertools.accumulate(len(t) for t in texts))
    if not chars or not chars[-1]:
        return [0] * len(texts)
    marks = [round(total * c / chars[-1]) for c in chars]
    return [b - a for a, b in zip([0, *marks], marks, strict=False)]
