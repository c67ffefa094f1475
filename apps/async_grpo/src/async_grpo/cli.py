"""The `async-grpo` console script.

The full training job lands with the app issue; until then this entry point says so plainly
and exits with a non-zero status instead of pretending to train.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    del argv
    print(
        "async-grpo: the training loop has not landed yet; see apps/async_grpo/README.md.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
