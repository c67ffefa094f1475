"""`async-grpo export RUN_DIR_OR_CHECKPOINT OUT_DIR [--force]`: a run's checkpoint as a Hugging
Face model directory.

    uv run async-grpo export runs/async-grpo exported/tiny     # the run's newest checkpoint
    uv run async-grpo export runs/async-grpo/checkpoints/step-000400 exported/v400
    uv run async-grpo export runs/async-grpo exported/tiny --force    # replace OUT_DIR

RUN_DIR_OR_CHECKPOINT is a run's output directory (its newest complete checkpoint is
exported) or one checkpoint of it (`checkpoints/step-NNNNNN`), written by any number of
trainer processes. OUT_DIR receives the weights at that version (safetensors, float32, one
file set whatever the trainer's sharding), the base model's config and tokenizer, a
generation config with the run's sampling settings, and `async_grpo.json` (the checkpoint,
its version and the run's config). Load it with `transformers`:

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("exported/tiny")

load it in vLLM (`vllm.LLM("exported/tiny")`), score it with `async-grpo eval
exported/tiny`, or train on from it (`async-grpo --model exported/tiny`). A checkpoint that
is incomplete or damaged, a path that is neither a run nor a checkpoint, and an OUT_DIR
that exists and is not empty (without `--force`) are one-line errors (exit status 2) and
nothing is written: the export is written beside OUT_DIR and renamed into place at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

from async_grpo.checkpoint.export import (
    base_model,
    check_destination,
    find_checkpoint,
    load_checkpoint,
    write_model,
)
from async_grpo.checkpoint.resume import saved_config

PROG = "async-grpo export"


def parse_args(argv: list[str]) -> tuple[Path, Path, bool]:
    """(RUN_DIR_OR_CHECKPOINT, OUT_DIR, --force) of a command line, without looking at the
    disk; `ValueError` names what is wrong."""
    force = "--force" in argv
    args = [a for a in argv if a != "--force"]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; the only option is --force")
    if len(args) != 2:
        raise ValueError(
            f"expected RUN_DIR_OR_CHECKPOINT OUT_DIR, got {len(args)} argument(s) {args}; "
            "see --help"
        )
    return Path(args[0]), Path(args[1]), force


def main(argv: list[str]) -> int:
    """`async-grpo export RUN_DIR_OR_CHECKPOINT OUT_DIR [--force]`: exit status 0, 2 on bad
    input (one line on stderr, nothing written), 1 when writing failed."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        source, out, force = parse_args(argv)
        checkpoint = find_checkpoint(source)
        check_destination(out, checkpoint, base_model(checkpoint, saved_config(checkpoint)), force)
        policy = load_checkpoint(checkpoint)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        write_model(policy, out)
    except OSError as e:
        print(f"{PROG}: error: writing {out} failed: {e}", file=sys.stderr)
        return 1
    params = sum(p.numel() for p in policy.model.parameters())
    print(
        f"{PROG}: {checkpoint} (version {policy.version}, {params:,} parameters, base model "
        f"{policy.base}) -> {out}"
    )
    return 0
