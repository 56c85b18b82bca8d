"""The server's settings (`python -m server`), declared once: flags, checks, GetStats'
`settings` map and the comparison's warnings come from here (records/declare.py).

Choices named by a registry (presets, policies, routers, kernels, cache policies, dtypes)
are the server's own and are checked by it (server/settings.py), as are the checks that need
the model or the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from records.declare import Settings, group, require
from records.server_settings.engine import Batching, Model, MoE, Parallel
from records.server_settings.serving import Faults, Limits, Security, Serving, window_of

__all__ = ["Batching", "Faults", "Limits", "MoE", "Model", "Parallel", "Security", "ServerSettings",
           "Serving", "window_of"]


@dataclass(frozen=True)
class ServerSettings(Settings):
    serving: Serving = group(Serving)
    security: Security = group(Security)
    limits: Limits = group(Limits)
    model: Model = group(Model)
    batching: Batching = group(Batching)
    moe: MoE = group(MoE)
    parallel: Parallel = group(Parallel)
    faults: Faults = group(Faults)

    def __post_init__(self):
        super().__post_init__()
        require(not self.serving.enable_return_routed_experts or self.parallel.ep == 1,
                "enable-return-routed-experts", "is for one process: with --ep the ranks' "
                "routing is not gathered")

    @property
    def kv_slots(self) -> int:
        return self.batching.kv_slots or self.batching.max_batch_size
