"""`async-grpo export RUN_DIR_OR_CHECKPOINT OUT_DIR [--force] [--adapter-only]`: a run's
checkpoint as a Hugging Face model directory.

    uv run async-grpo export runs/async-grpo exported/tiny     # the run's newest checkpoint
    uv run async-grpo export runs/async-grpo/checkpoints/step-000400 exported/v400
    uv run async-grpo export runs/async-grpo exported/tiny --force    # replace OUT_DIR
    uv run async-grpo export runs/lora exported/adapter --adapter-only  # a LoRA run's adapter

RUN_DIR_OR_CHECKPOINT is a run's output directory (its newest complete checkpoint is
exported) or one checkpoint of it (`checkpoints/step-NNNNNN`), written by any number of
trainer processes. OUT_DIR receives the weights at that version (safetensors, float32, one
file set whatever the trainer's sharding), the base model's config and tokenizer, a
generation config with the run's sampling settings, and `async_grpo.json` (the checkpoint,
its version and the run's config). Load it with `transformers`:

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("exported/tiny")

load it in vLLM (`vllm.LLM("exported/tiny")`), score it with `async-grpo eval
exported/tiny`, or train on from it (`async-grpo --model exported/tiny`).

A LoRA run (`--trainer.lora.rank R`) exports the base model with its adapters merged in,
loaded as above with `transformers` alone. `--adapter-only` writes the adapter alone
(`adapter_config.json`, `adapter_model.safetensors`, the tokenizer, the generation config,
`async_grpo.json`), which `peft` puts back onto the base model the adapter config names:

    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(BASE)
    model = PeftModel.from_pretrained(base, "exported/adapter")

`async-grpo eval exported/adapter` scores it merged onto that base. A checkpoint that
is incomplete or damaged, a path that is neither a run nor a checkpoint, and an OUT_DIR
that exists and is not empty (without `--force`) are one-line errors (exit status 2) and
nothing is written: the export is written beside OUT_DIR and renamed into place at the end.
"""

from __future__ import annotations

import dataclasses
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
OPTIONS = ("--force", "--adapter-only")


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    """The command line: what to export, where to, `--force`, `--adapter-only`."""

    source: Path
    out: Path
    force: bool = False
    adapter_only: bool = False


def parse_args(argv: list[str]) -> ExportArgs:
    """The command line, read without looking at the disk; `ValueError` names what is
    wrong."""
    args = [a for a in argv if a not in OPTIONS]
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; the options are {', '.join(OPTIONS)}")
    if len(args) != 2:
        raise ValueError(
            f"expected RUN_DIR_OR_CHECKPOINT OUT_DIR, got {len(args)} argument(s) {args}; "
            "see --help"
        )
    return ExportArgs(Path(args[0]), Path(args[1]), "--force" in argv, "--adapter-only" in argv)


def main(argv: list[str]) -> int:
    """`async-grpo export ...`: exit status 0, 2 on bad input (one line on stderr, nothing
    written), 1 when writing failed."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        a = parse_args(argv)
        out = a.out
        checkpoint = find_checkpoint(a.source)
        check_destination(
            out, checkpoint, base_model(checkpoint, saved_config(checkpoint)), a.force
        )
        policy = load_checkpoint(checkpoint, adapter_only=a.adapter_only)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        write_model(policy, out)
    except OSError as e:
        print(f"{PROG}: error: writing {out} failed: {e}", file=sys.stderr)
        return 1
    if policy.adapter is not None:
        params = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
        what = f"the LoRA adapter alone, {params:,} parameters"
    else:
        params = sum(p.numel() for p in policy.model.parameters())
        what = f"{params:,} parameters" + (
            ", LoRA adapters merged" if policy.config.trainer.lora.enabled else ""
        )
    where = f"base model {policy.base}"
    print(f"{PROG}: {checkpoint} (version {policy.version}, {what}, {where}) -> {out}")
    return 0
