"""Checks of what a GPU would do with ops that a CPU run cannot show."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class CpuOperands(TorchDispatchMode):
    """Records every op that receives tensors of more than one device, such as a CPU tensor
    beside tensors on the meta device (which stands in for a GPU in these tests): on a GPU such
    an op is an error (a ternary op like ``addcdiv``) or copies the CPU operand to the device
    with a stream sync (``where``); only binary ops read a 0-dim one as a scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if len({t.device.type for t in leaves}) > 1:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
