"""Versioned episode store between rollout generation and training."""

__version__ = "0.1.0"
