"""The tensor-parallel process group: its rank and size, the collectives the sharded layers
call, and the control messages rank 0 sends the other ranks.

One process per device. The group comes from the environment torchrun sets (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: one node or several through
`--nnodes --rdzv-endpoint`), or from flashlane itself, which spawns the other ranks on
127.0.0.1 with a free port (parallel/launch.py). The backend follows the device: NCCL on
GPUs, gloo on CPUs; control messages (Python objects) always go over a gloo group, so they
never touch the GPU.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# A rank that waits this long for the others has lost them (a crashed peer, a wrong port).
TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """One rank's handle on its group. `group`: the tensors' collectives (NCCL or gloo);
    `control`: gloo, for the objects rank 0 broadcasts (the same group on the CPU)."""

    rank: int
    size: int
    group: Any  # torch.distributed.ProcessGroup
    control: Any  # torch.distributed.ProcessGroup (gloo)
    device: str  # this rank's: cpu, or cuda:LOCAL_RANK

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's x [..., D], added in rank order (r0 + r1 + ...), the same
        bits on every rank. A ring all-reduce splits the buffer by its size, so an element's
        summation order would follow the row count: a row's bits would depend on the batch
        (DESIGN.md section 1). Gathering the parts and adding them in a fixed order keeps
        each row's result its own, alone, batched or drafted."""
        parts = self._gather(x)
        # added in at least fp32 and rounded once, as one rank's GEMM rounds its fp32 sums
        acc = torch.promote_types(x.dtype, torch.float32)
        out = parts[0].to(acc)
        for part in parts[1:]:
            out = out + part.to(acc)
        return out.to(x.dtype)

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x [..., D] side by side in rank order -> [..., size * D] (a
        vocab-parallel head's logits: each rank computed its slice of the vocabulary)."""
        return torch.cat(self._gather(x), dim=-1)

    def _gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return parts

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's obj, on every rank (the others pass nothing)."""
        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; a race with another process
    taking it before the group binds it is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_torchrun() -> bool:
    """Whether torchrun (or another launcher with its variables) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def join(
    device: str, size: int, rank: int | None = None, port: int | None = None
) -> TensorParallel:
    """Join the group of `size` ranks: from torchrun's environment when rank is None, else
    as `rank` of a group flashlane spawned on 127.0.0.1:port (on GPUs rank r takes
    cuda:LOCAL_RANK, or cuda:r when spawned)."""
    if rank is None:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ValueError(
                f"--tensor-parallel-size {size}, but the launcher started {world} processes"
                f" (WORLD_SIZE): give torchrun --nnodes x --nproc-per-node = {size}"
            )
        init = "env://"
        local = int(os.environ.get("LOCAL_RANK", rank))
    else:
        init, local = f"tcp://127.0.0.1:{port}", rank
    if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        # gloo binds the interface the host name resolves to, which may not reach loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = backend_for(device)
    if backend == "nccl":
        # NVLink multicast (NVLS) must stay off on the shared H200 machines: it takes fabric
        # memory other tenants' jobs need, and the lender asks for NCCL_NVLS_ENABLE=0
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        device = f"cuda:{local}" if device == "cuda" else device
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=size, timeout=TIMEOUT)
    group = dist.group.WORLD
    control = group if backend == "gloo" else dist.new_group(backend="gloo", timeout=TIMEOUT)
    return TensorParallel(rank, size, group, control, device)


def leave() -> None:
    """Tear the group down (each rank, at its end)."""
    if dist.is_initialized():
        dist.destroy_process_group()
