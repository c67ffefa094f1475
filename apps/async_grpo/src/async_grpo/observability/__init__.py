"""What a run reports: its metrics (`metrics`, one JSON line per step via `sink`), the
progress lines and summary (`console`), and the HTML report (`report`). The spans
themselves are recorded by `async_grpo.tracing`.
"""
