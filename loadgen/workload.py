"""What each request asks for: seeded prompts of an exact token count (fixed, or uniform in
a range).

Prompts are sent as token ids of printable ASCII bytes, valid for any server whose
vocabulary starts with the 256 byte tokens, so the prompt length is exact and the
generator never needs the server's tokenizer.
"""

from __future__ import annotations

import random

from proto import moe_pb2

PRINTABLE = range(32, 127)


def make_request(index: int, config) -> moe_pb2.GenerateRequest:
    rng = random.Random(f"{config.seed}:{index}")  # the same request whichever process sends it
    length = rng.randint(config.prompt_tokens, config.prompt_tokens_max) if config.prompt_tokens_max \
        else config.prompt_tokens
    ids = [rng.choice(PRINTABLE) for _ in range(length)]
    return moe_pb2.GenerateRequest(request_id=f"{config.seed}-{index}", prompt_token_ids=ids,
                                   max_tokens=config.max_tokens, ignore_eos=True)
