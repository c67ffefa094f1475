"""Versioned, non-blocking weight sync between Monarch actors."""

__version__ = "0.1.0"
