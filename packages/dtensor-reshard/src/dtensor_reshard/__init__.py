"""Move DTensor weights between shardings, transferring only what overlaps.

Pure planning (no process group needed): `Layout`, `plan`, `TransferPlan`, `PlanCache`,
`ReshardPlan`, `render_overlap`.
"""

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.layout import Layout, Placement
from dtensor_reshard.picture import render_overlap
from dtensor_reshard.planner import Piece, Send, TransferPlan, plan
from dtensor_reshard.reshard_plan import PlanCache, ReshardPlan, Slot

__version__ = "0.1.0"

__all__ = [
    "Box",
    "Layout",
    "Piece",
    "Placement",
    "PlanCache",
    "ReshardError",
    "ReshardPlan",
    "Send",
    "Slot",
    "TransferPlan",
    "__version__",
    "plan",
    "render_overlap",
]
