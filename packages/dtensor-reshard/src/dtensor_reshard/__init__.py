"""Move DTensor weights between shardings, transferring only what overlaps."""

__version__ = "0.1.0"
