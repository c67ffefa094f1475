"""Reading a `RunConfig` from `--section.field value` arguments (the command line, or a dict
of dotted keys in tests and benchmarks).

`tyro` builds the command line from the config dataclasses: every field's docstring is its
`--help` line, shown with its value in the preset given as the default. `parse` turns a
rejected argument into a one-line `ConfigError` naming the key (an unknown key suggests the
closest known one) instead of tyro's box; `apply_overrides` is the same parser fed from a
dict. Neither modifies the default it is given. Ranges are checked afterwards, by
`config.validate`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import io
from collections.abc import Sequence
from typing import Any

import tyro
from tyro import _errors as tyro_errors

from async_grpo.config.presets import DEFAULT_PRESET, PRESETS
from async_grpo.config.schema import ConfigError, RunConfig


def _parse_bool(raw: str) -> bool:
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return value[raw.lower()]
    except KeyError:
        raise ValueError(f"expected true or false, got {raw!r}") from None


_REGISTRY = tyro.constructors.ConstructorRegistry()


@_REGISTRY.primitive_rule
def _bool_rule(
    info: tyro.constructors.PrimitiveTypeInfo,
) -> tyro.constructors.PrimitiveConstructorSpec[bool] | None:
    """Booleans are written `true`/`false`, as values (`--model.chat_template true`)."""
    if info.type is not bool:
        return None
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar="{true,false}",
        instance_from_str=lambda args: _parse_bool(args[0]),
        is_instance=lambda x: isinstance(x, bool),
        str_from_instance=lambda x: [str(x).lower()],
    )


def config_keys(cfg: object, prefix: str = "") -> list[str]:
    """Every settable dotted key of a config dataclass (`trainer.lr`, `mode`, ...)."""
    keys: list[str] = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += config_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def take_flag(
    argv: Sequence[str], flag: str, *, bare: str | None = None
) -> tuple[str | None, list[str]]:
    """Takes `flag VALUE` / `flag=VALUE` out of `argv`: (VALUE, None without `flag`; the
    rest). `flag` followed by no value (the end, or another `--option`) gives `bare`, and is
    an error when `bare` is None. The last one counts."""
    rest: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        key, eq, given = argv[i].partition("=")
        if key != flag:
            rest.append(argv[i])
        elif eq:
            value = given
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            i += 1
        elif bare is not None:
            value = bare
        else:
            raise ConfigError(f"{flag} needs a value")
        i += 1
    return value, rest


def unknown_key(key: str) -> ConfigError:
    """The error for `--key`, which names no config field, with the closest known key."""
    close = difflib.get_close_matches(key, config_keys(RunConfig()), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _flag_key(arg: Any) -> str:
    """`trainer.lr` for tyro's argument `--trainer.lr` (its longest spelling)."""
    flags = [str(f) for f in arg.lowered.name_or_flags] or [str(arg.lowered.metavar)]
    return max(flags, key=len).lstrip("-")


def _to_config_error(event: Any) -> None:
    """Turns tyro's report of a rejected argument into a one-line `ConfigError`.

    tyro would print a box and exit; raising here replaces that (`tyro._errors` is tyro's
    hook for it). Events this does not know fall through to the generic handling in `parse`.
    """
    ev = tyro_errors
    if isinstance(event, ev.UnrecognizedArgs):
        token = event.tokens[0]
        if token.startswith("--"):
            raise unknown_key(token[2:].partition("=")[0])
        raise ConfigError(f"unexpected argument {token!r}; options look like --trainer.lr 3e-4")
    if isinstance(event, ev.InvalidChoice):
        key = _flag_key(event.argument)
        raise ConfigError(f"{key}: {event.value!r} is not one of {list(event.choices)}")
    if isinstance(event, ev.BadValue) and event.reason == "too_few_values":
        raise ConfigError(f"--{_flag_key(event.argument)} needs a value")
    if isinstance(event, ev.InstantiationFailure) and event.argument is not None:
        key = _flag_key(event.argument)
        message = event.message
        for tp in ("float", "int"):  # Python's "could not convert string to float: 'x'"
            if f"to {tp}" in message or f"for {tp}()" in message:
                message = f"expected {tp}, got {message.rpartition(': ')[2]}"
        raise ConfigError(f"{key}: {message}")


def parse(
    args: Sequence[str],
    default: RunConfig,
    *,
    description: str | None = None,
    reserved: Sequence[str] = (),
) -> RunConfig:
    """A new `RunConfig`: `default` with `--section.field value` arguments applied.

    `--help` prints the help (every field's docstring and its value in `default`) and raises
    `SystemExit(0)`, as tyro does. A bad argument raises `ConfigError` naming it, and so does
    one of `reserved` (options the caller sets itself, such as a benchmark's `--steps`);
    `default` itself is never modified.
    """
    for arg in args:
        if arg.split("=", 1)[0] in reserved:
            raise ConfigError(f"{arg.split('=', 1)[0]} is set by this script, not after --")
    err = io.StringIO()
    try:
        with tyro_errors.on_parse_error(_to_config_error), contextlib.redirect_stderr(err):
            return tyro.cli(
                RunConfig,
                args=list(args),
                default=copy.deepcopy(default),
                prog="async-grpo",
                description=description,
                use_underscores=True,
                config=(tyro.conf.FlagConversionOff,),
                registry=_REGISTRY,
            )
    except SystemExit as e:
        if e.code in (0, None):
            raise
        # A rejection the hook did not turn into a ConfigError: tyro's box, as one line.
        text = " ".join(err.getvalue().translate(str.maketrans("", "", "│╭╮╰╯─")).split())
        raise ConfigError(text or "invalid arguments (see --help)") from None


def apply_overrides(cfg: RunConfig, overrides: dict[str, str]) -> RunConfig:
    """Returns a copy of `cfg` with dotted keys (`trainer.lr`, `mode`) set from strings.

    The same parser as the command line (`{"trainer.lr": "5e-4"}` is `--trainer.lr 5e-4`);
    a bad key or value raises `ConfigError` and `cfg` itself is never modified.
    """
    return parse([f"--{key}={value}" for key, value in overrides.items()], cfg)


def split_preset(argv: list[str]) -> tuple[str, list[str]]:
    """Takes `--preset NAME` (or `--preset=NAME`) out of `argv`: (preset, the rest)."""
    preset, rest = take_flag(argv, "--preset")
    if preset is None:
        return DEFAULT_PRESET, rest
    if preset not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {preset!r}; known: {sorted(PRESETS)}")
    return preset, rest


def build_config(argv: list[str], help_text: str = "") -> RunConfig:
    """The `RunConfig` of a command line: the preset's, with every `--section.field value`
    applied. Raises `ConfigError` on bad input; `--help` prints `help_text`, the presets and
    every option, and raises `SystemExit(0)`."""
    preset, rest = split_preset(argv)
    presets = ", ".join(f"{name} (default here)" if name == preset else name for name in PRESETS)
    description = f"{help_text}\nPresets: {presets}. The defaults below are {preset}'s."
    return parse(rest, PRESETS[preset](), description=description)
