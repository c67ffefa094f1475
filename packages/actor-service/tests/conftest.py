"""Test setup shared by every test module.

Monarch finds a dead process by polling; the period is read from the environment when
`monarch` is first imported (default 10 s). The tests shorten it to 1 s so that fault tests
take seconds, not minutes; everything still works (only slower) with the default.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

# The test actors live in `service_actors.py` beside this file (they are pickled by value
# to the replica processes, see that module).
sys.path.insert(0, os.path.dirname(__file__))
