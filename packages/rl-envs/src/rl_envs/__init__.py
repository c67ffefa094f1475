"""Environments for RL on LLMs."""

__version__ = "0.1.0"
