"""The errors a running job raises that an operator handles: re-exported from ``streamplatform``
and described in docs/guarantees.md ("What an operator catches").

Each one means nothing of the batch in flight was committed; they differ in what to do next.
"""

from __future__ import annotations

from streamplatform.exceptions import StreamPlatformError


class JobClaimedError(StreamPlatformError, RuntimeError):
    """Another live driver holds the job (one driver per ``application.id``). Wait for it to
    stop, or raise ``platform.claim.wait.ms`` to wait here; the CLI exits with 3."""


class JobFencedError(StreamPlatformError, RuntimeError):
    """This driver's claim was taken over by a newer driver; its commit was not written. The
    newer driver replays the batch; this one must stop (the CLI exits with 3)."""


class ReplayRefused(StreamPlatformError, RuntimeError):
    """A batch planned under another topology, code or settings would be replayed. A person
    decides: run the code it was planned with, or ``StreamingJob.discard_uncommitted_batch()``
    (``streamplatform discard-batch``); the CLI exits with 4."""


class MissingTaskOutputs(StreamPlatformError, RuntimeError):
    """A task of the batch had records and its outputs did not reach the driver: the batch
    is not committed (the message names the task and where its outputs were looked for).
    Running again re-runs the batch; if it recurs, the Delta root is not storage that every
    executor and the driver reach at the same URI."""
