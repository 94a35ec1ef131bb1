"""What every execution path is: it runs a planned batch's tasks and writes every output of
the batch except the commit log (the spine's), and says what a crash at each step leaves."""

from __future__ import annotations

from streamplatform.runtime.batch_outputs import Progress
from streamplatform.runtime.job_context import BatchPlan, JobContext


class ExecutionPath:
    """One way of running a batch. ``name`` is reported in the batch's result, its progress
    line and its Dagster metadata."""

    name = ""

    def __init__(self, context: JobContext) -> None:
        self.context = context

    def run(self, plan: BatchPlan, changelog_files: object) -> Progress:
        """Run the tasks and write the batch's outputs (all idempotent by the batch's
        transaction id); returns the tasks' progress. Raises when any of it failed: the
        batch is then not committed, and its next attempt replays the same plan."""
        raise NotImplementedError

    def after_commit(self) -> None:
        """Called once the batch is committed: drop what only this attempt needed."""

    def release(self) -> None:
        """Called after the batch, committed or not: free what the path holds (cached
        output)."""
