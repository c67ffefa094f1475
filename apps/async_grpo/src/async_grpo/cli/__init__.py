"""The `async-grpo` command: a training run (`main`), `report` and `sweep`."""
