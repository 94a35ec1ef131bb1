"""Where the jobs keep their data: the Delta root and the local state stores' directory.

Empty paths resolve when a run starts, under ``streamplatform.home.data_dir()``: ``.data/delta``
and ``.data/state`` (``STREAMPLATFORM_DATA`` moves both). On a cluster point the Delta root at
shared storage (``STREAMPLATFORM_DELTA_ROOT=s3a://bucket/streams``) and the state dir at a
local disk of the executors (``STREAMPLATFORM_STATE_DIR``).
"""

from __future__ import annotations

import os

import dagster as dg
from pydantic import Field

from streamplatform.home import data_dir


class DeltaRootResource(dg.ConfigurableResource):
    """``platform.delta.root``: every job's tables live under ``<path>/<application.id>/``."""

    path: str = Field(default="", description="Delta root. Empty: .data/delta.")

    def root(self) -> str:
        return (self.path or str(data_dir() / "delta")).rstrip("/")

    def table(self, *parts: str) -> str:
        """A table path under the root: ``table("transactions-dedup", "_dlq")``."""
        return "/".join([self.root(), *parts])


class StateDirResource(dg.ConfigurableResource):
    """``state.dir``: a task's stores live in ``<path>/<application.id>/<task id>/``."""

    path: str = Field(default="", description="State directory. Empty: .data/state.")

    def directory(self) -> str:
        return self.path or str(data_dir() / "state")


def delta_root_from_env() -> DeltaRootResource:
    value = os.environ.get("STREAMPLATFORM_DELTA_ROOT")
    return (
        DeltaRootResource(path=dg.EnvVar("STREAMPLATFORM_DELTA_ROOT"))
        if value
        else DeltaRootResource()
    )


def state_dir_from_env() -> StateDirResource:
    value = os.environ.get("STREAMPLATFORM_STATE_DIR")
    return (
        StateDirResource(path=dg.EnvVar("STREAMPLATFORM_STATE_DIR"))
        if value
        else StateDirResource()
    )
