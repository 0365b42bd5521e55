"""Several processes, one run: `accelerate launch -m uqbench run ...` (or ``torchrun``).

Every process runs the same program: it builds the same suite, the same models and walks the
same (pair, split) loop. Work is split where it is heavy:

- training: each optimiser step's batch is split across processes (DDP, gradients all-reduced;
  `baselines.train.train`);
- forward records: each split's length-sorted batches are dealt round-robin to the processes and
  the records gathered back (`baselines.forward.collect`), so every process holds every record;
- caches: process 0 decides hit or miss and is the only one to write (`get_or_compute`,
  `build_dir`); the others follow its decision, so every process meets every collective;
- the report: only process 0 scores and writes it.

With one process (``WORLD_SIZE`` unset or 1) none of this imports accelerate and every helper is
a no-op, so single-process runs are unchanged. On GPUs the backend is NCCL, on CPU gloo (the
test path: 2 processes on CPU give the same records as 1).

Example
-------
    accelerate launch --multi_gpu --num_processes 4 -m uqbench run --profile full \\
        --backbone meta-llama/Llama-3.1-8B
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch


def _launched() -> bool:
    """Started by a distributed launcher with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _state() -> Any:
    """accelerate's process state (initialises the process group on first use)."""
    from accelerate import PartialState

    # PartialState picks NCCL for GPUs; without one it must be told to use CPU (gloo), else it
    # would fall back to a single non-distributed process
    return PartialState(cpu=not torch.cuda.is_available())


def world() -> int:
    """Number of processes (1 outside a distributed launch)."""
    return _state().num_processes if _launched() else 1


def rank() -> int:
    """This process's index, 0..world()-1."""
    return _state().process_index if _launched() else 0


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    """Where this process puts its model: its own GPU (by local rank), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", _state().local_process_index if _launched() else 0)


def barrier() -> None:
    if _launched():
        _state().wait_for_everyone()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Process 0 runs the block first (it builds caches), the others after it (they read them)."""
    if not _launched():
        yield
        return
    with _state().main_process_first():
        yield


def gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order, on every process (pickled; keep it small)."""
    if not _launched():
        return [obj]
    out: list[Any] = [None] * world()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Process 0's ``obj`` on every process."""
    if not _launched():
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj], from_process=0)[0]


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of a (detached) tensor over processes."""
    if not _launched():
        return x
    y = x.detach().clone()
    torch.distributed.all_reduce(y)
    return y


def get_or_compute(cache: Any, kind: str, material: Mapping[str, Any],
                   compute: Callable[[], Mapping[str, Any]]) -> tuple[dict[str, Any], bool]:
    """`uqbench.files.cache.ArrayCache.get_or_compute` across processes: process 0 looks the entry
    up and hands it to the others; on a miss every process computes (``compute`` may hold
    collectives) and process 0 stores the result."""
    if not _launched():
        return cache.get_or_compute(kind, material, compute)
    hit = broadcast(cache.get(kind, material) if is_main() else None)
    if hit is not None:
        return hit, True
    arrays = dict(compute())
    if is_main():
        cache.put(kind, material, arrays)
    return arrays, False


def build_dir(cache: Any, kind: str, material: Mapping[str, Any],
              write: Callable[[Path], None]) -> Path:
    """`uqbench.files.cache.DirCache` get-or-build across processes: every process runs ``write``
    (it may train with DDP), only process 0's folder is published; the others write to a throwaway
    folder and then use process 0's."""
    if not _launched():
        return cache.get(kind, material) or cache.build(kind, material, write)
    found = broadcast(cache.get(kind, material) is not None if is_main() else None)
    if not found:
        if is_main():
            cache.build(kind, material, write)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                write(Path(tmp))
    barrier()
    return Path(cache.path(kind, material))


__all__ = ["all_sum", "barrier", "broadcast", "build_dir", "device", "gather", "get_or_compute",
           "is_main", "main_first", "rank", "world"]
