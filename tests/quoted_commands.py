"""The commands the project's Markdown quotes, found for `test_doc_commands.py`.

They are read from fenced code blocks and inline code of every `*.md` file (lines ending in
`\\` joined to the next): `uv run async-grpo ...` (also `async-grpo ...` in inline code, and
with `uv run`'s own options such as `--extra vllm`), its `sweep`, `export`, `eval` and
`report` subcommands, `uv run python SCRIPT.py ...` and `uv run python -m MODULE ...`.
Anything else (nox, pytest, ruff) is not a quoted command here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".nox", ".offline", ".whl", "node_modules"}
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")  # may wrap, never past a blank line
UV_OPTIONS_WITH_VALUE = {"--extra", "--with", "--group", "--python", "--package"}
ENDS_A_COMMAND = {"&&", "||", ";", "|", "...", "#"}
REPORT_MODULE = "async_grpo.observability.report.build"


@dataclass(frozen=True)
class Quoted:
    """A command quoted in a Markdown file. `kind` is "train", "sweep", "export", "eval",
    "report", "script" or "module"; `target` the script's path or the module's name ("" for
    the others);
    `args` what follows the program."""

    doc: str
    line: int
    kind: str
    target: str
    args: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}: {' '.join(self.args)}"


def markdown_files() -> list[Path]:
    return sorted(
        p for p in ROOT.rglob("*.md") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
    )


def snippets(text: str) -> list[tuple[int, str]]:
    """(line number, code) for every line of a fenced block (continuations joined) and
    every inline code span (its line breaks made spaces)."""
    found: list[tuple[int, str]] = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        joined, start = "", first
        for i, line in enumerate(block.group(1).splitlines()):
            if not joined:
                start = first + i
            if line.endswith("\\"):  # continued on the next line: one command
                joined += line[:-1] + " "
                continue
            found.append((start, joined + line))
            joined = ""
        if joined:
            found.append((start, joined))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).replace("\\`", "")
    for span in INLINE.finditer(prose):
        found.append((prose.count("\n", 0, span.start()) + 1, " ".join(span.group(1).split())))
    return sorted(found)


def tokens(code: str) -> list[str]:
    try:
        return shlex.split(code, comments=True)
    except ValueError:  # an unbalanced quote: a line of output, not a command
        return []


def commands_in(doc: str, text: str) -> list[Quoted]:
    """The commands quoted in one Markdown text (`doc` names it in messages)."""
    out: list[Quoted] = []
    for line, code in snippets(text):
        uv = re.search(r"(?:^|[\s(`])uv run(?=\s|$)", code)
        if uv is not None:
            rest = tokens(code[uv.end() :].split("`", 1)[0])
            while rest and rest[0].startswith("-"):  # uv's own options
                rest = rest[2:] if rest[0] in UV_OPTIONS_WITH_VALUE else rest[1:]
        elif code.startswith("async-grpo "):
            rest = tokens(code)
        else:
            continue
        for i, token in enumerate(rest):
            if token in ENDS_A_COMMAND:
                rest = rest[:i]
                break
        if rest and rest[-1].endswith(")") and "(" not in rest[-1]:
            rest[-1] = rest[-1].rstrip(")")  # "(uv run async-grpo report DIR)" in output
        quoted = classify(doc, line, rest)
        if quoted is not None:
            out.append(quoted)
    return out


def classify(doc: str, line: int, rest: list[str]) -> Quoted | None:
    if not rest:
        return None
    program, args = rest[0], tuple(rest[1:])
    if program == "async-grpo":
        if args[:1] == ("sweep",):
            return Quoted(doc, line, "sweep", "", args[1:])
        if args[:1] == ("report",):
            return Quoted(doc, line, "report", REPORT_MODULE, args[1:])
        if args[:1] in (("export",), ("eval",)):
            return Quoted(doc, line, args[0], "", args[1:])
        return Quoted(doc, line, "train", "", args)
    if program == "python" and len(args) >= 2 and args[0] == "-m":
        return Quoted(doc, line, "module", args[1], args[2:])
    if program == "python" and args and args[0].endswith(".py"):
        if "<" in args[0] or "*" in args[0]:
            return None  # a placeholder: examples/<file>
        return Quoted(doc, line, "script", args[0], args[1:])
    return None  # nox, pytest, ruff, mypy: not checked here


def all_quoted() -> list[Quoted]:
    found: list[Quoted] = []
    for path in markdown_files():
        found += commands_in(str(path.relative_to(ROOT)), path.read_text())
    return found


def flags(args: tuple[str, ...]) -> list[str]:
    """The `--options` of a command line, a usage synopsis's brackets stripped, up to a bare
    `--` (what follows is handed on: the run options of a benchmark that starts runs)."""
    out = []
    for token in args:
        bare = token.lstrip("[").rstrip("]")
        if bare == "--":
            break
        if bare.startswith("--"):
            out.append(bare.split("=", 1)[0].split("|", 1)[0].rstrip("]"))
    return out
