"""A request as scheduling carries it, from admission (server/frontends/admission.py) to its last
token: what it asks, where it stands (KV slot, prompt tokens prefilled, tokens generated), and
the events its sink receives on the engine thread (a token, then the last one with its usage; or
a failure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch


class FinishReason(StrEnum):
    """Why a request's stream ended without an error."""

    LENGTH = "LENGTH"  # its max_tokens
    STOP = "STOP"  # a stop token
    ABORT = "ABORT"  # the server shut down, its grace over


@dataclass(kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    queue_us: int
    prefill_us: int
    decode_us: int
    # with --enable-return-routed-experts: [tokens, L, k] int16 expert ids of the prompt (-1 for
    # tokens from the prefix cache) and of the output tokens that went through the model (all
    # but the last); None otherwise
    routed_experts: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class TokenEvent:
    token_id: int
    finish_reason: FinishReason | None = None  # on the request's last token
    usage: Usage | None = None  # on the last token only


@dataclass
class FailureEvent:
    error: Exception  # a ServerError subclass or the engine's exception; ends the request


@dataclass(eq=False, kw_only=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    # called under the engine thread's lock: must not block
    sink: Callable[[TokenEvent | FailureEvent], None]
    ignore_eos: bool = False
    min_tokens: int = 0  # end-of-sequence among the first min_tokens outputs is ignored
    temperature: float = 0.0
    seed: int = 0
    priority: int = 0
    # who sent it (server/frontends/security.py client_of): admission is fair across them
    client: str = ""
    received_ns: int = field(default_factory=time.monotonic_ns)
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens in the KV cache
    admitted_ns: int = 0
    first_token_ns: int = 0
    last_run_ns: int = 0  # last step that included it (expert_aware's age bound)
    prefill_us: int = 0  # engine time of the steps that prefilled it
    signature: torch.Tensor | None = None  # [L, E] experts its last step used
    # with --enable-return-routed-experts: its tokens' experts, [n, L, k] a step
    prompt_routing: list[torch.Tensor] = field(default_factory=list)
    output_routing: list[torch.Tensor] = field(default_factory=list)
    # the prefix cache's (server/scheduling/prefix_cache.py): its prompt's block keys, worked
    # out once; the slot its cached prefix comes from, until the step that takes it in
    block_keys: list[int] | None = None
    prefix_from: int | None = None
    done: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def prompt_left(self) -> int:
        return len(self.prompt_ids) - self.prefilled
