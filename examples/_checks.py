"""The one helper every example shares: a check that prints its outcome."""


def expect(ok: bool, what: str) -> None:
    """Print `ok: what`; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")
