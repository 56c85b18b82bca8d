"""The reference servers' routed experts (--routed-experts vllm|sglang): seeded, with a known
skew and a known affinity, so a run's routing views can be checked against what was sent.

The model has LAYERS MoE layers of EXPERTS experts, top-TOP_K. Each token's experts in a layer
are drawn without replacement by weight: a Zipf-like popularity (1 / (rank + 1), the ranks
rotated one expert a layer, so the hottest expert of layer l is l), and each request's group
(its arrival number mod GROUPS) weighs its 2 x TOP_K home experts AFFINITY times more, so
requests of one group share experts. A request's routing depends only on --seed and its
arrival number. What went out is summed in `Truth`, served at GET /expert_truth.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

LAYERS, EXPERTS, TOP_K = 4, 16, 2
SHAPE = f"{LAYERS}x{EXPERTS}x{TOP_K}"  # what --moe-shape reads it with
GROUPS = 4
AFFINITY = 8.0


def weights(group: int) -> np.ndarray:
    """[LAYERS, EXPERTS] draw weights of a request of this group."""
    ranks = (np.arange(EXPERTS)[None, :] - np.arange(LAYERS)[:, None]) % EXPERTS
    w = 1.0 / (ranks + 1)
    home = (group * 2 * TOP_K + np.arange(2 * TOP_K)) % EXPERTS
    w[:, home] *= AFFINITY
    return w


def route(seed: int, request_no: int, tokens: int) -> np.ndarray:
    """[tokens, LAYERS, TOP_K] expert ids of one request: Gumbel top-k, which draws TOP_K
    distinct experts with probabilities proportional to the weights."""
    rng = np.random.default_rng([seed, request_no])
    gumbel = -np.log(-np.log(rng.random((tokens, LAYERS, EXPERTS))))
    scores = np.log(weights(request_no % GROUPS))[None] + gumbel
    return np.argsort(-scores, axis=2)[:, :, :TOP_K].astype(np.int32)


def counts(ids: np.ndarray) -> np.ndarray:
    """[tokens, LAYERS, TOP_K] -> [LAYERS, EXPERTS]."""
    out = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    for layer in range(LAYERS):
        out[layer] = np.bincount(ids[:, layer].ravel(), minlength=EXPERTS)
    return out


@dataclass
class Truth:
    """What the server sent: token counts per layer and expert, and each request's experts."""

    prompt: np.ndarray = field(default_factory=lambda: np.zeros((LAYERS, EXPERTS), np.int64))
    output: np.ndarray = field(default_factory=lambda: np.zeros((LAYERS, EXPERTS), np.int64))
    sets: list[list[list[int]]] = field(default_factory=list)  # per request, per layer
    recording: bool = False  # SGLang's recorder between start and stop
    recorded: list[np.ndarray] = field(default_factory=list)  # [LAYERS, EXPERTS] a request

    def add(self, prompt_ids: np.ndarray, output_ids: np.ndarray) -> None:
        self.prompt += counts(prompt_ids)
        self.output += counts(output_ids)
        both = np.concatenate([prompt_ids, output_ids])
        self.sets.append([sorted(set(both[:, layer].ravel().tolist()))
                          for layer in range(LAYERS)])
        if self.recording:
            self.recorded.append(counts(both))

    def json(self) -> dict:
        return {"shape": SHAPE, "prompt": self.prompt.tolist(), "output": self.output.tolist(),
                "sets": self.sets}


def as_base64(ids: np.ndarray) -> str:
    """SGLang's form: the int32 ids flattened, base64."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode()


def spoiled(fault: str, ids: np.ndarray) -> np.ndarray | list | None:
    """A routing fault's ids (None: the reply leaves them out)."""
    if fault == "routing-none":
        return None
    if fault == "routing-range":
        return np.where(np.arange(ids.size).reshape(ids.shape) == 0, EXPERTS + 3, ids)
    if fault == "routing-layers":
        return ids[:, :-1]
    if fault == "routing-ragged":
        lists = ids.tolist()
        lists[0][0] = lists[0][0][:1]
        return lists
    return ids


def reply_fields(mode: str, asked: bool, prompt_ids: np.ndarray, output_ids: np.ndarray,
                 fault: str) -> tuple[dict, dict]:
    """(fields of the last choice, fields of a response-level event) as vLLM (lists on the
    choice and the response) or SGLang (base64 in sglext, only when the request asked) send
    them; either may be empty."""
    if mode == "vllm":
        prompt, output = spoiled(fault, prompt_ids), spoiled(fault, output_ids)
        if output is None:
            return {}, {}
        listed = [a if isinstance(a, list) else a.tolist() for a in (prompt, output)]
        return {"routed_experts": listed[1]}, {"prompt_routed_experts": listed[0]}
    if mode != "sglang" or not asked:
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
