"""Asynchronous GRPO on Qwen-architecture models, composed from the monarch-rl packages."""

__version__ = "0.1.0"
