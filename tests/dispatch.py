"""What a piece of torch code dispatches, counted on the CPU: every aten operation, and those
that make a CUDA device wait for the host to read a value (a host sync there). The CPU runs the
same operations a GPU would, so a CPU test holds a step to its budgets between GPU runs."""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

# aten operations that read a device tensor's values on the host before they can return (their
# output's size or a Python number depends on them): each is a host sync on CUDA
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique2",
           "unique_consecutive", "bincount", "histc", "multinomial", "is_nonzero", "equal",
           "allclose", "item"}


class Dispatched(TorchDispatchMode):
    """Counts the aten operations run inside it (by name, overload dropped), and keeps the
    shapes of their tensor arguments in order: `shapes` is the step's whole shape signature."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name == "repeat_interleave" and func._overloadname == "Tensor" \
                and (kwargs or {}).get("output_size") is None:
            self.ops["repeat_interleave_unsized"] += 1
        self.shapes.append((name, *(tuple(a.shape) for a in args if hasattr(a, "shape"))))
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(n for name, n in self.ops.items() if name != "repeat_interleave_unsized")

    @property
    def syncs(self) -> dict[str, int]:
        """The operations that would wait for a GPU, with how often each ran."""
        return {name: n for name, n in self.ops.items()
                if name in SYNCING or name == "repeat_interleave_unsized"}
