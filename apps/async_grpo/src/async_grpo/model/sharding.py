"""FSDP-style data parallelism for the trainer (`trainer.procs > 1`).

`torch.distributed`'s `fully_shard` (FSDP2) turns every parameter into a `Shard(0)` DTensor
over the trainer's processes (gloo on CPU, nccl on GPU): a rank holds 1/procs of each
weight and of the AdamW state; the forward and backward passes gather and reduce-scatter
layer by layer. The process mesh needs Monarch's `setup_torch_elastic_env_async` before the
trainer is spawned on it (it sets the rendezvous environment read here).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import PreTrainedModel


def shard_model(model: PreTrainedModel, device: torch.device) -> tuple[int, int]:
    """Joins the trainer's process group and shards `model` in place on `device`: each decoder
    layer is its own unit (gathered only while it computes), then the rest (embeddings, final
    norm, head) as the root unit. Returns (rank, world size)."""
    cuda = device.type == "cuda"
    if cuda:
        # Pinned to its own GPU by the device map, a rank sees one; else it picks its local
        # rank's of those it sees.
        local = int(os.environ.get("LOCAL_RANK", "0")) if torch.cuda.device_count() > 1 else 0
        torch.cuda.set_device(local)
        model.cuda()  # type: ignore[call-arg]
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    for layer in getattr(getattr(model, "model", None), "layers", []):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return rank, world
