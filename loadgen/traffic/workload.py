"""What each request asks for, seeded by its run-wide index so any process builds the same
request: one shape (--prompt-tokens, --max-tokens), request classes drawn by weight
(--classes, mixed mode), conversations from a ShareGPT-style file (--dataset), or a trace's
requests (--trace, loadgen/traffic/traces.py); a session's turns are built from these parts
by loadgen/traffic/sessions.py. In any of them, a shared prefix first (--shared-prefix-tokens,
one of --prefix-groups, drawn per request).

Synthetic prompts are token ids of printable ASCII bytes: sent as ids where the protocol
takes ids (valid for any server whose vocabulary starts with the 256 byte tokens, so their
length is exact and the generator never needs the server's tokenizer), as that ASCII text
where it takes text. Dataset prompts are text; their token counts are the server's
(usage.prompt_tokens).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from loadgen.targets.target import RequestSpec
from loadgen.traffic.traces import replayed
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode

PRINTABLE = range(32, 127)


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    prompt_tokens: int
    max_tokens: int


def parse_classes(spec: str) -> list[RequestClass]:
    """'name:weight:prompt_tokens:max_tokens,...'"""
    classes = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) != 4:
            raise ValueError(f"class {item!r} is not name:weight:prompt_tokens:max_tokens")
        name, weight, prompt, out = parts
        try:
            c = RequestClass(name, float(weight), int(prompt), int(out))
        except ValueError:
            raise ValueError(f"class {item!r}: weight, prompt_tokens and max_tokens must be "
                             "numbers") from None
        if c.weight <= 0 or c.prompt_tokens < 1 or c.max_tokens < 1:
            raise ValueError(f"class {item!r}: weight above 0, prompt_tokens and max_tokens "
                             "at least 1")
        classes.append(c)
    if len({c.name for c in classes}) != len(classes):
        raise ValueError(f"class names repeat in {spec!r}")
    return classes


def load_conversations(path: str) -> list[list[tuple[str, str]]]:
    """Each conversation of a ShareGPT-style JSON list as its (human turn, the gpt reply to
    it) pairs in order: an item's 'conversations' holds turns with 'from' (human/gpt) and
    'value'; a human turn not answered by the next is left out, conversations without a pair
    are skipped."""
    try:
        items = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    conversations = []
    for item in items if isinstance(items, list) else []:
        turns = item.get("conversations", []) if isinstance(item, dict) else []
        turns = [t for t in turns if isinstance(t, dict)]
        pairs = [(ask["value"], reply["value"])
                 for ask, reply in zip(turns, turns[1:], strict=False)
                 if ask.get("from") == "human" and reply.get("from") == "gpt"
                 and ask.get("value") and reply.get("value")]
        if pairs:
            conversations.append(pairs)
    if not conversations:
        raise ValueError(f"{path} has no conversation with a human turn followed by a gpt turn")
    return conversations


def load_dataset(path: str) -> list[tuple[str, str]]:
    """(prompt, reply) pairs: each conversation's first human turn and the reply to it."""
    return [pairs[0] for pairs in load_conversations(path)]


class Workload:
    def __init__(self, settings: LoadSettings):
        self.seed = settings.traffic.seed
        self.shape = c = settings.workload
        uses_classes = settings.traffic.mode == Mode.MIXED and not c.dataset
        self.classes = parse_classes(c.classes) if uses_classes else []
        sessions = settings.traffic.mode == Mode.SESSIONS  # loadgen/traffic/sessions.py reads it
        self.dataset = load_dataset(c.dataset) if c.dataset and not sessions else []
        self.trace = replayed(settings.traffic) if settings.traffic.trace else ()
        self.block_tokens = settings.traffic.trace_block_tokens
        target = settings.target
        self.unstreamed = target.routed_experts_sample if target.routed_experts != "off" else 0.0

    def request(self, index: int) -> RequestSpec:
        """The request with this run-wide index (its class '' without classes), its shared
        prefix, and whether and when the client cancels it (each drawn apart, so neither
        changes the rest of the request)."""
        spec = self._spec(index)
        prefix = self.prefix_of(index)
        if prefix and spec.prompt_ids:
            spec = replace(spec, prompt_ids=prefix + spec.prompt_ids)
        elif prefix:
            spec = replace(spec, prompt_text=bytes(prefix).decode("ascii") + spec.prompt_text)
        return self.with_draws(spec, str(index))

    def with_draws(self, spec: RequestSpec, key: str) -> RequestSpec:
        """spec, sent non-streamed or else cancelled by the client part-way where the draws for
        `key` (a request's index, a session's turn) say so (--routed-experts-sample,
        --cancel-share; a reply read whole is never cancelled)."""
        if self.unstreamed and random.Random(f"{self.seed}:{key}:whole").random() < self.unstreamed:
            return replace(spec, stream=False)
        if not self.shape.cancel_share or spec.max_tokens < 2:
            return spec  # no draw (seeding a Random costs ~5 us: a request's third)
        rng = random.Random(f"{self.seed}:{key}:cancel")
        if rng.random() < self.shape.cancel_share:
            return replace(spec, cancel_after=rng.randint(1, spec.max_tokens - 1))
        return spec

    def shared_prefix(self, group: int) -> tuple[int, ...]:
        """The group's fixed prefix: --shared-prefix-tokens printable byte ids."""
        rng = random.Random(f"{self.seed}:prefix:{group}")
        return tuple(rng.choice(PRINTABLE) for _ in range(self.shape.shared_prefix_tokens))

    def prefix_of(self, index: int) -> tuple[int, ...]:
        """The shared prefix the request (or session) with this index starts with; () without
        --shared-prefix-tokens."""
        if not self.shape.shared_prefix_tokens:
            return ()
        group = random.Random(f"{self.seed}:{index}:group").randrange(self.shape.prefix_groups)
        return self.shared_prefix(group)

    def trace_block(self, hash_id: int) -> tuple[int, ...]:
        """A Mooncake hash id's block: the same tokens wherever the id comes."""
        rng = random.Random(f"{self.seed}:block:{hash_id}")
        return tuple(rng.choice(PRINTABLE) for _ in range(self.block_tokens))

    def _from_trace(self, index: int, rng: random.Random, rid: str) -> RequestSpec:
        """The trace's request (a loop's later passes repeat it): its exact prompt length,
        built from its hash ids' blocks where it has them (the last one cut), then its own
        tokens; its text where it has one; its output length."""
        entry = self.trace[index % len(self.trace)]
        if entry.prompt:
            return RequestSpec(rid, entry.max_tokens, prompt_text=entry.prompt,
                               session=entry.session)
        ids = tuple(itertools.chain.from_iterable(self.trace_block(h) for h in entry.hash_ids))
        ids = ids[:entry.prompt_tokens]
        ids += tuple(rng.choice(PRINTABLE) for _ in range(entry.prompt_tokens - len(ids)))
        return RequestSpec(rid, entry.max_tokens, prompt_ids=ids, session=entry.session)

    def _spec(self, index: int) -> RequestSpec:
        c = self.shape
        rng = random.Random(f"{self.seed}:{index}")
        rid = f"{self.seed}-{index}"
        if self.trace:
            return self._from_trace(index, rng, rid)
        if self.dataset:
            prompt, reply = rng.choice(self.dataset)
            out = min(len(reply.encode()), c.max_tokens)  # the reply's length in bytes, capped
            return RequestSpec(rid, out, prompt_text=prompt, request_class="dataset")
        if self.classes:
            k = rng.choices(self.classes, weights=[k.weight for k in self.classes])[0]
            length, out, name = k.prompt_tokens, k.max_tokens, k.name
        else:
            length = (rng.randint(c.prompt_tokens, c.prompt_tokens_max) if c.prompt_tokens_max
                      else c.prompt_tokens)
            out, name = c.max_tokens, ""
        ids = tuple(rng.choice(PRINTABLE) for _ in range(length))
        return RequestSpec(rid, out, prompt_ids=ids, request_class=name)
