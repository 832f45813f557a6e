"""The retry policy every eagle3 task uses.

The exception classes are named by dotted path and live in eagle3/errors.py,
which imports no torch: the DAG processor resolves them at parse time.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

# Tests set this to 1 s; dag.test() polls retries every second.
OOM_RETRY_DELAY = timedelta(seconds=float(os.environ.get("EAGLE3_OOM_RETRY_DELAY_S", "10")))

EAGLE3_RETRY_POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(
            exception="eagle3.errors.GpuOutOfMemory",
            action=RetryAction.RETRY,
            retry_delay=OOM_RETRY_DELAY,
            reason="GPU out of memory: state saved with a smaller micro-batch; resuming",
        ),
        RetryRule(
            exception=["eagle3.errors.InputError", "eagle3.errors.GateFailed"],
            action=RetryAction.FAIL,
            reason="bad input or failed gate: a retry cannot fix it",
        ),
    ],
    default=RetryAction.DEFAULT,
)
