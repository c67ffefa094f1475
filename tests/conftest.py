"""The workspace's tests: their helpers (`quoted_commands`, `help_runner`) live beside this
file, and pytest's importlib mode does not put this directory on `sys.path` itself."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
