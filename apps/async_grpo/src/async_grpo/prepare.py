"""Everything checked and built in the controller before any process is spawned: the
config's ranges, the dataset (a malformed file fails here, with its line number), the reward
spec, and the checkpoint directory every process will load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from async_grpo.checkpoints import CheckpointNotFound, locate_checkpoint
from async_grpo.config import ConfigError, RunConfig, validate
from async_grpo.model import write_random_checkpoint
from async_grpo.presets import ARCHS
from async_grpo.rewards import parse_weights
from async_grpo.tasks import Sample, corpus_for, load_hf_dataset, load_jsonl


@dataclasses.dataclass(frozen=True)
class Prepared:
    """`model_path`: a directory (or hub id) every actor loads with `from_pretrained`;
    `samples`: the dataset when it comes from a file or HF, None for a generated task."""

    model_path: str
    samples: list[Sample] | None


def load_samples(cfg: RunConfig) -> list[Sample] | None:
    if cfg.data.path:
        return load_jsonl(Path(cfg.data.path), cfg.data.prompt_key, cfg.data.target_key)
    if cfg.data.hf_name:
        return load_hf_dataset(
            cfg.data.hf_name, cfg.data.hf_split, cfg.data.prompt_key, cfg.data.target_key
        )
    return None


def resolve_model(cfg: RunConfig, samples: list[Sample] | None, out_dir: Path) -> str:
    """The checkpoint to load: `model.path`, or a random one of `model.arch` written now."""
    m = cfg.model
    if m.path and not m.random_weights:
        try:
            return locate_checkpoint(m.path)
        except CheckpointNotFound as e:
            raise ConfigError(str(e)) from None
    if m.arch not in ARCHS:
        raise ConfigError(f"model.arch: unknown architecture {m.arch!r}; known: {sorted(ARCHS)}")
    corpus = corpus_for(cfg.data.task, cfg.data.min_n, cfg.data.max_n, samples or ())
    path = out_dir / f"checkpoint-{m.arch}-seed{m.init_seed}"
    return str(write_random_checkpoint(path, ARCHS[m.arch], corpus, seed=m.init_seed))


def prepare(cfg: RunConfig) -> Prepared:
    """Validates `cfg` and builds what the processes need; raises before spawning anything."""
    validate(cfg)
    try:
        parse_weights(cfg.reward.fns)
    except ValueError as e:
        raise ConfigError(f"reward.fns: {e}") from None
    samples = load_samples(cfg)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return Prepared(resolve_model(cfg, samples, out_dir), samples)
