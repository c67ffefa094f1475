"""The one exception type this package raises for bad input."""


class ReshardError(ValueError):
    """A layout, plan or buffer cannot be used as given.

    Raised before any byte moves: a rejected call leaves every tensor untouched.
    """
