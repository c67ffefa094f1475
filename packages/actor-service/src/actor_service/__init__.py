"""Load-balanced, fault-tolerant replica services on Monarch."""

__version__ = "0.1.0"
