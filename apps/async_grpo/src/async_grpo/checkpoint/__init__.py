"""A run's checkpoints: the directory on disk, written atomically and read back whole
(`disk`), the controller's state in it (`state`), the trainer's distributed checkpoint
(`trainer_state`), continuing a run from one (`resume`), and its policy as a model you can
use (`export`).
"""
