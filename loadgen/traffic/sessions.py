"""Multi-turn sessions (--mode sessions, docs/workloads.md): what each session asks, and its
conversation so far.

A session's plan is seeded by its run-wide index, so any process builds the same: its number
of turns (--session-turns), the think time before each later turn (--think-time-s), and each
turn's user message and output length. Synthetic messages are --prompt-tokens printable byte
ids, the first after the session's shared prefix (--shared-prefix-tokens); with --dataset a
session is one ShareGPT conversation, its human turns the messages (as many as it has, up to
the turns drawn), each reply's length in bytes the output asked (capped by --max-tokens).

Each turn's prompt is the whole history: the earlier messages and the server's actual replies,
then the new message. It goes as token ids while every part of it is known as ids (synthetic
messages, and replies of protocols that stream ids), else as text (a dataset's messages,
replies streamed as text); --tokenizer turns one form into the other where the parts disagree.
Chat endpoints get the history as alternating user and assistant messages.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loadgen.targets.target import RequestSpec
from loadgen.traffic.draws import Draw
from loadgen.traffic.workload import PRINTABLE, Workload, load_conversations
from records.load_settings import LoadSettings


@dataclass(frozen=True)
class Part:
    """One message of a conversation, in the forms known: token ids, text, or both."""

    ids: tuple[int, ...] | None = None
    text: str | None = None


@dataclass(frozen=True)
class SessionPlan:
    index: int  # run-wide
    session_id: str
    messages: tuple[Part, ...]  # the user's, one a turn
    max_tokens: tuple[int, ...]  # each turn's output asked
    think_s: tuple[float, ...]  # before each later turn, from the previous reply's end


class SessionPlanner:
    def __init__(self, settings: LoadSettings, workload: Workload):
        self.settings, self.workload = settings, workload
        traffic = settings.traffic
        self.turns = Draw.parse(traffic.session_turns, whole=True)
        self.think = Draw.parse(traffic.think_time_s)
        dataset = settings.workload.dataset
        self.conversations = load_conversations(dataset) if dataset else []

    def plan(self, index: int) -> SessionPlan:
        seed, shape = self.settings.traffic.seed, self.settings.workload
        rng = random.Random(f"{seed}:session:{index}")
        turns = int(self.turns(rng))
        if self.conversations:
            pairs = rng.choice(self.conversations)[:turns]
            messages = [Part(text=ask) for ask, _ in pairs]
            outs = [min(len(reply.encode()), shape.max_tokens) for _, reply in pairs]
        else:
            messages = [self._synthetic(rng) for _ in range(turns)]
            outs = [shape.max_tokens] * turns
        prefix = self.workload.prefix_of(index)
        if prefix:
            first = messages[0]
            messages[0] = Part(prefix + first.ids if first.ids is not None else None,
                               bytes(prefix).decode("ascii") + (first.text or ""))
        think = tuple(self.think(rng) for _ in messages[1:])
        return SessionPlan(index, f"{seed}-s{index}", tuple(messages), tuple(outs), think)

    def _synthetic(self, rng: random.Random) -> Part:
        shape = self.settings.workload
        length = (rng.randint(shape.prompt_tokens, shape.prompt_tokens_max)
                  if shape.prompt_tokens_max else shape.prompt_tokens)
        ids = tuple(rng.choice(PRINTABLE) for _ in range(length))
        return Part(ids, bytes(ids).decode("ascii"))


class History:
    """A session's conversation so far; `ask` builds a turn's request, `answered` adds the
    server's reply. tokenizer: a `tokenizers.Tokenizer` (--tokenizer), or None."""

    def __init__(self, plan: SessionPlan, workload: Workload, tokenizer=None):
        self.plan, self.workload, self.tokenizer = plan, workload, tokenizer
        self.parts: list[Part] = []

    def ask(self, turn: int) -> RequestSpec:
        """Turn `turn`'s request (1-based): the history, then its message."""
        parts = [*self.parts, self.plan.messages[turn - 1]]
        if self.tokenizer is not None:
            parts = [self._both(p) for p in parts]
        ids = [p.ids for p in parts]
        texts = [p.text for p in parts]
        rid = f"{self.plan.session_id}-t{turn}"
        dialogue = tuple(texts) if None not in texts else ()
        common = {"session": self.plan.session_id, "turn": turn, "dialogue": dialogue}
        if None not in ids:
            prompt = {"prompt_ids": tuple(i for part in ids for i in part)}
        elif dialogue:
            prompt = {"prompt_text": "".join(dialogue)}
        else:  # the settings check asks for --tokenizer where this could come
            raise ValueError("the history holds text and token ids: give --tokenizer")
        spec = RequestSpec(rid, self.plan.max_tokens[turn - 1], **prompt, **common)
        return self.workload.with_draws(spec, f"{self.plan.session_id}:{turn}")

    def answered(self, spec: RequestSpec, reply: Part) -> None:
        """The turn went through: its message and the server's reply join the history."""
        self.parts += [self.plan.messages[spec.turn - 1], reply]

    def _both(self, part: Part) -> Part:
        if part.ids is None:
            return Part(tuple(self.tokenizer.encode(part.text, add_special_tokens=False).ids),
                        part.text)
        if part.text is None:
            return Part(part.ids, self.tokenizer.decode(list(part.ids)))
        return part
