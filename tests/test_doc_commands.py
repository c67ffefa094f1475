"""Every command the Markdown quotes parses, so a reader who copies one gets a run, not an
error about an option that no longer exists.

The commands are found by `quoted_commands.py`; each kind is checked here:

- `uv run async-grpo ...` (also `async-grpo ...` in inline code, and with `uv run`'s own
  options such as `--extra vllm`): parsed as the command parses them, `--resume [PATH]`
  taken out first (`checkpoint.resume.split_resume`), then `config.args.build_config`, which
  rejects an unknown key or an ill-typed value, then `config.validate` (ranges and how
  fields fit together), the reward weights, the placement and the device map (on a machine
  with 0, 1 or 8 GPUs; a launcher's tools are not looked for). Paths such as `DIR` or
  `/path/to/...` are values and parse; nothing is checked on disk.
- `async-grpo sweep ...`: the sweep's own `--ages` read as the sweep reads it, the rest as a
  training command.
- `async-grpo export ...` and `async-grpo eval ...`: read as the commands read them
  (`cli.export.parse_args`; `cli.eval_options.split_args`, `read_config` on the preset's
  config, `eval_options`), the model and the checkpoint not looked for on disk.
- `async-grpo report ...`, `uv run python SCRIPT.py ...` and `uv run python -m MODULE ...`:
  every `--option` quoted must be one the script's `argparse` parser declares (read from its
  source), and the script must exist. The slow test runs `--help` of each such script in a
  process of its own (forked by `help_runner.py`) and checks the options there too.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from async_grpo.checkpoint.resume import split_resume
from async_grpo.cli import eval_options
from async_grpo.cli import export as export_command
from async_grpo.cli.sweep import parse_ages
from async_grpo.config.args import build_config, take_flag
from async_grpo.config.presets import DEFAULT_PRESET, PRESETS
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.config.validate import validate
from async_grpo.launch import prepare
from async_grpo.tasks.rewards import parse_weights
from quoted_commands import ROOT, Quoted, all_quoted, commands_in, flags


def source_of(quoted: Quoted) -> Path | None:
    """The file that declares the command's options, None where it cannot be found."""
    if quoted.kind == "script":
        path = ROOT / quoted.target
        return path if path.is_file() else None
    spec = importlib.util.find_spec(quoted.target)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    if origin.name == "__init__.py" and (origin.parent / "__main__.py").is_file():
        origin = origin.parent / "__main__.py"  # `python -m package` runs its __main__
    return origin


def declared_options(source: Path) -> set[str] | None:
    """The `--options` the file's `argparse` calls declare (`add_argument("--x", ...)`),
    plus `--help`; None when one of them is not a literal (then only `--help` can tell)."""
    options = {"-h", "--help"}
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        for arg in node.args:
            if not isinstance(arg, ast.Constant):
                return None
            if isinstance(arg.value, str) and arg.value.startswith("-"):
                options.add(arg.value)
    return options


GPU_COUNTS = (0, 1, 8)
"""The machines a quoted command is planned for: without a GPU, with one, with eight. A
command must fit one of them (a `--preset qwen2.5-0.5b` command is not meant for the CPU)."""


def check_placement(cfg: RunConfig) -> None:
    """Plans where every process runs and which GPUs it takes, as the command does before
    it starts anything (`launch.prepare.plan_hosts`, `plan_gpus`), without asking whether a
    launcher's tools (`sbatch`, the `kubernetes` package) are installed here. Raises
    `ConfigError` when no machine of `GPU_COUNTS` fits."""
    with mock.patch.object(prepare, "check_launcher", return_value=None):
        plan = prepare.plan_hosts(cfg)
    errors: dict[str, list[int]] = {}
    for gpus in GPU_COUNTS:
        with mock.patch("torch.cuda.device_count", return_value=gpus):
            try:
                prepare.plan_gpus(cfg, plan)
                return
            except ConfigError as e:
                errors.setdefault(str(e), []).append(gpus)
    raise ConfigError("; ".join(f"with {n} GPU(s) here: {e}" for e, n in errors.items()))


def subcommand_problem(quoted: Quoted) -> str | None:
    """Why a quoted `export` or `eval` would not parse, or None when it does."""
    # A usage synopsis's optional parts ("[--force]") read as given.
    args = [a[1:-1] if a.startswith("[") and a.endswith("]") else a for a in quoted.args]
    if "--help" in args or "-h" in args:
        return None
    try:
        if quoted.kind == "export":
            export_command.parse_args(args)
            return None
        raw, flags, rest = eval_options.split_args(args)
        cfg = eval_options.read_config(rest, PRESETS[flags.preset or DEFAULT_PRESET]())
        target = eval_options.Target(raw, None, 0, None)
        # Read as on a machine with a GPU: a `--preset qwen2.5-0.5b` eval is meant for one.
        with mock.patch("torch.cuda.is_available", return_value=True):
            eval_options.eval_options(target, flags, cfg, rest)
    except ValueError as e:  # ConfigError is a ValueError
        return str(e)
    return None


def problem(quoted: Quoted) -> str | None:
    """Why the quoted command would not parse, or None when it does."""
    if quoted.kind in ("export", "eval"):
        return subcommand_problem(quoted)
    if quoted.kind in ("train", "sweep"):
        try:
            argv = list(quoted.args)
            if quoted.kind == "sweep":
                ages, argv = take_flag(argv, "--ages")
                if ages is not None:
                    parse_ages(ages)
                for flag in ("--mode", "--buffer.max_policy_age"):  # the sweep sets them
                    if take_flag(argv, flag)[0] is not None:
                        return f"{flag}: the sweep refuses it"
            else:
                _, argv = split_resume(argv)
            with contextlib.redirect_stdout(io.StringIO()):
                cfg = build_config(argv)
            validate(cfg)  # ranges and relations: pure, as the command checks them first
            parse_weights(cfg.reward.fns)
            check_placement(cfg)
        except SystemExit as e:  # --help
            return None if e.code in (0, None) else f"exit status {e.code}"
        except ValueError as e:  # ConfigError is a ValueError
            return str(e)
        return None
    source = source_of(quoted)
    if source is None:
        return f"{quoted.target}: no such script or module"
    declared = declared_options(source)
    if declared is None:
        return None  # options built at run time: the slow test asks the script itself
    unknown = [f for f in flags(quoted.args) if f not in declared]
    return f"unknown options {unknown} (known: {sorted(declared)})" if unknown else None


QUOTED = all_quoted()


def test_the_docs_quote_commands_of_every_kind() -> None:
    """Guards the reader above: if it stopped finding commands, every other test here would
    pass on nothing."""
    kinds = {q.kind for q in QUOTED}
    assert kinds >= {"train", "sweep", "report", "script", "module"}, kinds
    assert sum(q.kind == "train" for q in QUOTED) >= 40
    assert sum(q.kind == "script" for q in QUOTED) >= 30


@pytest.mark.parametrize("quoted", QUOTED, ids=lambda q: f"{q.doc}:{q.line}")
def test_quoted_command_parses(quoted: Quoted) -> None:
    why = problem(quoted)
    assert why is None, f"{quoted.where}\n  {why}"


def test_a_wrong_option_in_a_doc_is_caught() -> None:
    """Each kind of command, quoted with an option that does not exist, is reported."""
    doc = "\n".join(
        [
            "Run `uv run async-grpo --trainer.kl_coef 0.1` or:",
            "",
            "```bash",
            "uv run --extra vllm async-grpo --preset tiny \\",
            "    --generator.engin vllm        # a typo on the continued line",
            "uv run async-grpo sweep --ages 0,1 --mode sync",
            "uv run async-grpo --resume --out_dir /tmp/x --steps many",
            "uv run python examples/09_async_rl_train.py --batch 64",
            "uv run async-grpo report RUN_DIR --html out.html",
            "uv run python examples/no_such_example.py",
            "uv run async-grpo export RUN_DIR OUT_DIR --dtype bf16",
            "uv run async-grpo eval OUT_DIR --sample 8",
            "uv run async-grpo eval OUT_DIR --trainer.lr 1e-3",
            "```",
        ]
    )
    found = commands_in("doc.md", doc)
    kinds = ["train", "train", "sweep", "train", "script", "report", "script"]
    kinds += ["export", "eval", "eval"]
    assert [q.kind for q in found] == kinds
    assert found[1].args[-2:] == ("--generator.engin", "vllm")  # the continuation joined
    assert all(problem(q) is not None for q in found), [q.where for q in found if not problem(q)]
    right = commands_in("doc.md", "`uv run python examples/09_async_rl_train.py --steps 12`")
    assert [problem(q) for q in right] == [None]
    right = commands_in("doc.md", "`uv run async-grpo eval OUT_DIR --samples 8 --greedy false`")
    assert [problem(q) for q in right] == [None]
    # After a bare `--` a benchmark hands the options on to the runs it starts.
    bench = "uv run python apps/async_grpo/benchmarks/cpu_per_step.py"
    right = commands_in("doc.md", f"`{bench} --quick -- --mode sync`")
    assert [problem(q) for q in right] == [None]
    wrong = commands_in("doc.md", f"`{bench} --quik -- --mode sync`")
    assert [problem(q) is not None for q in wrong] == [True]


def _help_args(quoted: Quoted) -> list[str]:
    """What `python` runs for `quoted`'s `--help`."""
    if quoted.kind == "script":
        return [quoted.target, "--help"]
    if quoted.kind == "report":
        return ["-m", "async_grpo.cli", "report", "--help"]
    return ["-m", quoted.target, "--help"]


def _with_parsers() -> list[Quoted]:
    """One quoted command per script or module that has an argparse parser (a script
    without one would run whole instead of printing help), with every option quoted for
    it."""
    merged: dict[str, Quoted] = {}
    for q in QUOTED:
        if q.kind not in ("script", "module", "report"):
            continue
        source = source_of(q)
        if source is None or "add_argument" not in source.read_text():
            continue
        known = merged.get(q.target)
        args = (*known.args, *q.args) if known else q.args
        merged[q.target] = Quoted(q.doc, q.line, q.kind, q.target, args)
    return sorted(merged.values(), key=lambda q: q.target)


@dataclass(frozen=True)
class HelpText:
    """What `python ARGS --help` printed, and its exit status."""

    returncode: int
    stdout: str
    stderr: str


@functools.cache
def _help_texts() -> dict[str, HelpText]:
    """Every script's `--help`, each in a process forked by `help_runner.py` after it
    imported torch and transformers: as fresh processes they spent 80 s of CPU, nearly
    all of it importing those two again and again."""
    scripts = _with_parsers()
    runner = [sys.executable, str(ROOT / "tests" / "help_runner.py")]
    args = [json.dumps(_help_args(q)) for q in scripts]
    done = subprocess.run(
        [*runner, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    texts = [HelpText(**r) for r in json.loads(done.stdout)]
    return {q.target: t for q, t in zip(scripts, texts, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize("quoted", _with_parsers(), ids=lambda q: q.target)
def test_scripts_answer_help_with_the_quoted_options(quoted: Quoted) -> None:
    done = _help_texts()[quoted.target]
    assert done.returncode == 0, f"{quoted.target} --help: exit {done.returncode}\n{done.stderr}"
    missing = [f for f in flags(quoted.args) if not re.search(rf"{re.escape(f)}\b", done.stdout)]
    assert not missing, f"{quoted.target} --help does not list {missing}"
