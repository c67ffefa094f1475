"""Move DTensor weights between shardings, transferring only what overlaps.

Planning is pure (no process group needed): `Layout`, `plan`, `TransferPlan`, `PlanCache`,
`ReshardPlan`, `render_overlap`. Moving bytes: `ShardPublisher` on each source rank,
`pull` on each destination rank, with `SourceExport`s passed between them by the controller.
"""

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import PullStats, SourceExport
from dtensor_reshard.layout import Layout, Placement
from dtensor_reshard.picture import render_overlap
from dtensor_reshard.planner import Piece, TransferPlan, plan
from dtensor_reshard.publisher import ShardPublisher
from dtensor_reshard.puller import pull
from dtensor_reshard.reshard_plan import PlanCache, ReshardPlan, Slot

__version__ = "0.1.0"

__all__ = [
    "Box",
    "Layout",
    "Piece",
    "Placement",
    "PlanCache",
    "PullStats",
    "ReshardError",
    "ReshardPlan",
    "ShardPublisher",
    "Slot",
    "SourceExport",
    "TransferPlan",
    "__version__",
    "plan",
    "pull",
    "render_overlap",
]
