"""The `async-grpo` command's entry point (`uv run async-grpo`, `python -m async_grpo.cli`).

Before anything else, and before torch or Monarch is imported (each starts threads when
imported), it starts the stop-signal front (`launch.signals.install_front`): from then on a
Ctrl-C or SIGTERM arrives with the process that sent it, and the run names that process
when it stops ("[SIGTERM from pid 1234 (its command line): ending after this step with a
checkpoint ...]"). Then it runs `cli.main.main`.
"""

from __future__ import annotations

from async_grpo.launch.signals import install_front


def main() -> int:
    """`cli.main.main`, with the stop-signal front started first."""
    install_front()
    # Imported here, after the front: importing it imports torch and Monarch.
    from async_grpo.cli.main import main as command  # noqa: PLC0415

    return command()
