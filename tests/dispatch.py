"""What a piece of torch code dispatches, seen on the CPU: every aten operation with the shapes
it ran on (`Dispatched`), and whatever would make a CUDA device wait for the host (`DeviceWaits`).
The CPU runs the same operations a GPU would, so a CPU test holds a step to its budgets between
GPU runs."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from server.engine.host_transfer import HostTransfers


class Dispatched(TorchDispatchMode):
    """Counts the aten operations run inside it (by name, overload dropped), and keeps the
    shapes of their tensor arguments in order: `shapes` is the code's whole shape signature."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        self.shapes.append((name, *(tuple(a.shape) for a in args if hasattr(a, "shape"))))
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


class DeviceWaits(TorchDispatchMode):
    """What a step does that would wait for the device on CUDA, outside the counted reads of
    server/engine/host_transfer.py: operators that read it from the host (bincount its ids' bounds,
    multinomial its input's checks, .item() and `if tensor`, a boolean mask's size, unique,
    equal) or size their output by a read (repeat_interleave without output_size); and reads
    by hand (.tolist(), .item(), .cpu(), .numpy()) of any tensor the helper did not hand over."""

    WAITING = {"aten.bincount.default", "aten.multinomial.default", "aten.nonzero.default",
               "aten._local_scalar_dense.default", "aten.masked_select.default",
               "aten.equal.default", "aten.allclose.default"}
    READS = ("tolist", "item", "cpu", "numpy")

    def __init__(self, monkeypatch):
        super().__init__()
        self.seen = []
        handed = []  # the host's tensors: what the helper fetched (kept, so ids stay unique)
        fetch = HostTransfers.fetch

        def fetching(transfers, parts):
            out = fetch(transfers, parts)
            handed.extend(out)
            return out

        monkeypatch.setattr(HostTransfers, "fetch", fetching)
        for name in self.READS:
            monkeypatch.setattr(Tensor, name, self._watched(name, getattr(Tensor, name), handed))

    def _watched(self, name, read, handed):
        def watched(t, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.endswith("host_transfer.py") and all(t is not h for h in handed):
                self.seen.append(f"{name} in {Path(caller).name}:{sys._getframe(1).f_lineno}")
            return read(t, *args, **kwargs)
        return watched

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name, kwargs = str(func), kwargs or {}
        bool_index = name.startswith("aten.index") and any(
            isinstance(t, Tensor) and t.dtype == torch.bool
            for a in args if isinstance(a, list | tuple) for t in a)
        if name in self.WAITING or "unique" in name or bool_index or (
                name == "aten.repeat_interleave.Tensor" and kwargs.get("output_size") is None):
            self.seen.append(name)
        return func(*args, **kwargs)
