"""Move DTensor weights between shardings, transferring only what overlaps.

Versioned weight sync from a sharded trainer, with `rdma_tensor`'s shape:

    part = ShardedPublisher(rank).publish(state, version)   # each source rank: a snapshot
    manifest = merge(parts)                                 # the controller
    await pull(manifest, into=params)                       # each destination, all or nothing
    publisher.release(version)                              # every destination holds it

Planning is pure (no process group needed): `Layout`, `plan`, `TransferPlan`, `PlanCache`,
`ReshardPlan`, `render_overlap`. Moving bytes between any two layouts by an explicit plan:
`PlanPublisher` on each source rank, `pull_plan` on each destination rank, with
`SourceExport`s passed between them by the controller.
"""

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import PullStats, SourceExport
from dtensor_reshard.layout import Layout, Placement
from dtensor_reshard.manifest import ShardedManifest, ShardManifest, merge
from dtensor_reshard.picture import render_overlap
from dtensor_reshard.plan_publisher import PlanPublisher
from dtensor_reshard.plan_pull import pull_plan
from dtensor_reshard.planner import Piece, TransferPlan, plan
from dtensor_reshard.reshard_plan import PlanCache, ReshardPlan, Slot
from dtensor_reshard.sharded_publisher import ShardedPublisher, one_unsharded_copy
from dtensor_reshard.sharded_pull import ShardedPullResult, pull

__version__ = "0.1.0"

__all__ = [
    "Box",
    "Layout",
    "Piece",
    "Placement",
    "PlanCache",
    "PlanPublisher",
    "PullStats",
    "ReshardError",
    "ReshardPlan",
    "ShardManifest",
    "ShardedManifest",
    "ShardedPublisher",
    "ShardedPullResult",
    "Slot",
    "SourceExport",
    "TransferPlan",
    "__version__",
    "merge",
    "one_unsharded_copy",
    "plan",
    "pull",
    "pull_plan",
    "render_overlap",
]
