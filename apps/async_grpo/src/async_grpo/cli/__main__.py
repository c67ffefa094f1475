"""`python -m async_grpo.cli`: the `async-grpo` command."""

import sys

from async_grpo.cli.entry import main

sys.exit(main())
