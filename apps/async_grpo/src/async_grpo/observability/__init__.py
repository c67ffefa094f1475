"""What a run reports: its metrics (`metrics`, one JSON line per step via `sink`; what a
trained batch says, `batch_stats`), the progress lines and summary (`console`), how an
evaluation is scored (`scoring`: pass@k, per-prompt rows; shared with `async-grpo eval`),
and the HTML report (`report`). The spans themselves are recorded by `async_grpo.tracing`.
"""
