"""The `async-grpo` command: a training run (`main`), `report`, `sweep`, `export` and `eval`."""
