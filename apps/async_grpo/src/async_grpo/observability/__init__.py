"""What a run reports: its metrics (`metrics`, one JSON line per step via `sink`; what a
trained batch says, `batch_stats`), the progress lines and summary (`console`), how an
evaluation is scored (`scoring`: pass@k, per-prompt rows; shared with `async-grpo eval`),
the HTML report (`report`), and where a process that stopped answering was (`stuck`: a
hung one's stack; `crashes`: the stacks a crashed one wrote). The spans themselves are
recorded by `async_grpo.tracing`.
"""
