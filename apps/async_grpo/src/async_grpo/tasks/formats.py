"""Dataset formats: how one row of a file (or of a Hugging Face dataset) becomes a `Sample`.

- `jsonl`: the prompt and the target are two keys of the row (`data.prompt_key`,
  `data.target_key`; `prompt` and `target` by default), taken as they are.
- `gsm8k`: GSM8K as distributed, `{"question": ..., "answer": "<reasoning>\\n#### 72"}`; the
  target is the text after the last `####`, without thousands separators ("1,000" ->
  "1000"), since the reasoning before it is not what a response is checked against.
- `math`: MATH (Hendrycks et al.) as distributed, `{"problem": ..., "solution": "...
  \\boxed{\\frac{3}{4}}."}`; the target is the content of the solution's last `\\boxed{...}`,
  read up to its matching brace (the answer may hold braces of its own).

A row that lacks a key or whose target cannot be read raises `FormatError` naming the key;
the loader adds the file and the line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from async_grpo.config.schema import DataFormat

# The keys each format reads, (prompt, target); jsonl's come from the config.
FORMAT_KEYS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math": ("problem", "solution"),
}

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_BOXED = "\\boxed{"


class FormatError(ValueError):
    """A row that does not hold what its format needs."""


def strip_thousands(text: str) -> str:
    """ "1,000,000" -> "1000000"; a comma that does not separate groups of three digits
    ("1,2" as a pair, "3, 4") stays."""
    return _THOUSANDS.sub("", text)


def gsm8k_target(answer: str) -> str:
    """The final answer of a GSM8K solution: what follows its last `####`, normalised."""
    _, mark, tail = answer.rpartition("####")
    target = strip_thousands(tail.strip())
    if not mark or not target:
        raise FormatError("no final answer after '####'" if mark else "no '####' final answer")
    return target


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text`, up to its matching brace; None when
    there is none or it is never closed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    while i < len(text) and depth:
        if text[i] == "\\":  # \{ and \} are printed braces (a set), not a group
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start + len(_BOXED) : i - 1].strip() if depth == 0 else None


def math_target(solution: str) -> str:
    """The answer of a MATH solution: its last `\\boxed{...}`'s content."""
    boxed = last_boxed(solution)
    if boxed is None:
        raise FormatError("no complete \\boxed{...} answer")
    if not boxed:
        raise FormatError("an empty \\boxed{} answer")
    return boxed


def row_to_sample(
    fmt: DataFormat, row: Mapping[str, object], prompt_key: str, target_key: str
) -> tuple[str, str]:
    """(prompt, target) of one row in format `fmt`; `prompt_key` / `target_key` are
    jsonl's keys (the other formats have their own, `FORMAT_KEYS`)."""
    keys = FORMAT_KEYS.get(fmt, (prompt_key, target_key))
    missing = [k for k in keys if k not in row]
    if missing:
        raise FormatError(f"missing key(s) {', '.join(missing)}")
    prompt, raw = str(row[keys[0]]), str(row[keys[1]])
    if fmt == "jsonl":
        return prompt, raw
    try:
        return prompt, gsm8k_target(raw) if fmt == "gsm8k" else math_target(raw)
    except FormatError as e:
        raise FormatError(f"key {keys[1]!r}: {e}") from None
