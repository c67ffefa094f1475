"""The app's Monarch actors: thin wrappers that run the pure code in their own processes."""

from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator, WeightSync
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.reward import RewardActor
from async_grpo.actors.trainer import Trainer, TrainResult

__all__ = [
    "DatasetActor",
    "Generator",
    "ReferenceModel",
    "RewardActor",
    "TrainResult",
    "Trainer",
    "WeightSync",
]
