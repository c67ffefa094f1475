"""`python -m async_grpo.cli`: the `async-grpo` command."""

import sys

from async_grpo.cli.main import main

sys.exit(main())
