"""Move DTensor weights between shardings, transferring only what overlaps."""

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.layout import Layout, Placement
from dtensor_reshard.planner import Piece, Send, TransferPlan, plan

__version__ = "0.1.0"

__all__ = [
    "Box",
    "Layout",
    "Piece",
    "Placement",
    "ReshardError",
    "Send",
    "TransferPlan",
    "__version__",
    "plan",
]
