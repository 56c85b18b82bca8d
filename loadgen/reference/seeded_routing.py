"""The reference servers' routed experts (--routed-experts vllm|sglang): seeded, with a known
skew and a known affinity, so a run's routing views can be checked against what was sent.

The model's shape is --moe-shape (LAYERSxEXPERTSxTOP_K, 4x16x2 by default). Each token's
experts in a layer are drawn without replacement by weight: a Zipf-like popularity
(1 / (rank + 1), the ranks rotated one expert a layer, so the hottest expert of layer l is l),
and each request's group (its arrival number mod GROUPS) weighs its 2 x top-k home experts
AFFINITY times more, so requests of one group share experts. A request's routing depends only
on --seed, its arrival number mod POOL (so a fast run does not draw and encode each anew) and
its length. What went out is summed in `Truth`, served at GET /expert_truth.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass, field

import numpy as np

from records.expert_routes import counts_of

SHAPE = "4x16x2"  # the default --moe-shape: layers x experts x top-k
GROUPS = 4
POOL = 64  # routings drawn: the n-th request sends the (n mod POOL)-th (a multiple of GROUPS)
OUT_OF_RANGE = 9999  # the routing-range fault's id
AFFINITY = 8.0


@dataclass(frozen=True)
class Shape:
    layers: int
    experts: int
    top_k: int

    @classmethod
    def of(cls, text: str) -> Shape:
        return cls(*map(int, text.split("x")))

    def weights(self, group: int) -> np.ndarray:
        """[layers, experts] draw weights of a request of this group."""
        ranks = (np.arange(self.experts)[None, :] - np.arange(self.layers)[:, None]) % self.experts
        w = 1.0 / (ranks + 1)
        home = (group * 2 * self.top_k + np.arange(2 * self.top_k)) % self.experts
        w[:, home] *= AFFINITY
        return w

    def route(self, seed: int, request_no: int, tokens: int) -> np.ndarray:
        """[tokens, layers, top_k] expert ids of one request: Gumbel top-k, which draws top_k
        distinct experts with probabilities proportional to the weights."""
        rng = np.random.default_rng([seed, request_no])
        uniform = np.maximum(rng.random((tokens, self.layers, self.experts)), 1e-300)
        gumbel = -np.log(-np.log(uniform))
        scores = np.log(self.weights(request_no % GROUPS))[None] + gumbel
        top = np.argpartition(-scores, self.top_k - 1, axis=2)[:, :, :self.top_k]
        return top.astype(np.int32)



@dataclass
class Truth:
    """What the server sent: token counts per layer and expert, and each request's experts."""

    shape: Shape
    prompt: np.ndarray = field(init=False)
    output: np.ndarray = field(init=False)
    sets: list[list[list[int]]] = field(default_factory=list)  # per request, per layer
    recording: bool = False  # SGLang's recorder between start and stop
    recorded: list[np.ndarray] = field(default_factory=list)  # [layers, experts] a request

    def __post_init__(self):
        self.prompt = np.zeros((self.shape.layers, self.shape.experts), np.int64)
        self.output = np.zeros_like(self.prompt)

    def add(self, sent: Drawn) -> None:
        self.prompt += sent.prompt
        self.output += sent.output
        self.sets.append(sent.sets)
        if self.recording:
            self.recorded.append(sent.prompt + sent.output)

    def json(self) -> dict:
        return {"prompt": self.prompt.tolist(), "output": self.output.tolist(), "sets": self.sets}


@dataclass(frozen=True)
class Drawn:
    """One request's routing as sent: its reply's fields and what they count."""

    fields: tuple[dict, dict]  # (of the last choice, of a response-level event)
    prompt: np.ndarray  # [layers, experts]
    output: np.ndarray
    sets: list[list[int]]  # per layer, the experts its tokens used


@dataclass(frozen=True)
class Asked:
    """A request's lengths and how its routing goes back."""

    prompt_tokens: int
    max_tokens: int
    mode: str  # --routed-experts: vllm or sglang
    asked: bool  # the request asked for its routing (SGLang sends it only then)
    whole: bool  # the request is not streamed (vLLM sends routing only then)
    fault: str  # the stream's fault ("" for none)


@functools.lru_cache(maxsize=512)
def draw(shape: Shape, seed: int, index: int, request: Asked) -> Drawn:
    """The index-th routing of a request of these lengths, as its mode sends it. The output's
    last token has none, as in vLLM: it never went through the model."""
    prompt_tokens = request.prompt_tokens
    ids = shape.route(seed, index, prompt_tokens + request.max_tokens - 1)
    prompt_ids, output_ids = ids[:prompt_tokens], ids[prompt_tokens:]
    sets = [sorted(set(ids[:, layer].ravel().tolist())) for layer in range(shape.layers)]
    return Drawn(reply_fields(request, prompt_ids, output_ids, shape.experts),
                 counts_of(prompt_ids, shape.experts), counts_of(output_ids, shape.experts), sets)


def as_base64(ids: np.ndarray) -> str:
    """SGLang's form: the int32 ids flattened, base64."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode()


def as_npy(ids: np.ndarray, experts: int) -> bytes:
    """vLLM's form before its base64: an .npy file of uint8 ids (uint16 past 256 experts)."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(ids, np.uint8 if experts <= 256 else np.uint16),
            allow_pickle=False)
    return buffer.getvalue()


def spoiled(fault: str, ids: np.ndarray) -> np.ndarray | None:
    """A routing fault's ids (None: the reply leaves them out)."""
    if fault == "routing-none":
        return None
    if fault == "routing-range":
        return np.where(np.arange(ids.size).reshape(ids.shape) == 0, OUT_OF_RANGE, ids)
    if fault == "routing-layers":
        return ids[:, :-1]
    return ids


def reply_fields(request: Asked, prompt_ids: np.ndarray, output_ids: np.ndarray,
                 experts: int) -> tuple[dict, dict]:
    """(fields of the last choice, fields of a response-level event) as vLLM (base64 .npy of
    the prompt's and the output's rows on the choice of a reply not streamed) or SGLang
    (base64 in sglext, only when the request asked) send them; either may be empty."""
    fault = request.fault
    if request.mode == "vllm":
        ids = spoiled(fault, np.concatenate([prompt_ids, output_ids]))
        if ids is None or not request.whole:
            return {}, {}
        raw = as_npy(ids, max(experts, OUT_OF_RANGE + 1) if fault == "routing-range" else experts)
        raw = raw[:-1] if fault == "routing-truncated" else raw
        text = base64.b64encode(raw).decode()
        return {"routed_experts": text[:-3] + "!!!" if fault == "routing-base64" else text}, {}
    if request.mode != "sglang" or not request.asked:
        return {}, {}
    both = spoiled(fault, np.concatenate([prompt_ids, output_ids]))
    if both is None:
        return {}, {}
    text = as_base64(np.asarray(both))
    if fault == "routing-base64":
        text = text[:-3] + "!!!"
    if fault == "routing-truncated":
        text = as_base64(np.asarray(both).ravel()[:-1])
    return {}, {"sglext": {"routed_experts": text}}
