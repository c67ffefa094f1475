"""Spans from every process of a run on one clock, merged into one Chrome-trace timeline
(`tracer`: recording in each process; `files`: the per-process files merged and read back).

Imports nothing else of the app, so every process (actors included) can record spans; the
report reads the merged trace (`observability.report`).
"""

from async_grpo.tracing.tracer import (
    NULL_SPAN,
    TRACE_ENV,
    Span,
    Tracer,
    active,
    counter,
    session,
    span,
    start,
    start_from_env,
    stop,
    traced,
)

__all__ = [
    "NULL_SPAN",
    "TRACE_ENV",
    "Span",
    "Tracer",
    "active",
    "counter",
    "session",
    "span",
    "start",
    "start_from_env",
    "stop",
    "traced",
]
