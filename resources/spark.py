"""SparkResource: ``dagster_pyspark.PySparkResource`` set up by ``streamplatform.spark``.

What it adds to PySparkResource (which builds its session with ``getOrCreate`` and never stops
it):

- the settings come from :func:`streamplatform.spark.spark_conf` (Delta, the Kafka connector's
  jars from ``.jvm/spark``, the virtualenv's Python for workers); ``SPARK_MASTER`` points it
  at a cluster;
- the session is **stopped after the run** when this resource started it. A session that was
  already running in the process (a test suite's, a notebook's) is used and left running.

JVM-start settings only apply to the first session of a process, so the code location runs
its jobs with the in-process executor (``definitions.py``): one run, one process, one JVM,
started once and stopped at the end. The multiprocess executor would start a JVM per step.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from streamplatform.spark import spark_conf


class SparkResource(PySparkResource):
    """A Delta- and Kafka-capable SparkSession for one run; see the module docstring."""

    stop_after_run: bool = Field(
        default=True, description="Stop the session at the end of the run if this run began it."
    )
    _started_here: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        from pyspark import SparkContext

        master = self.spark_config.get("spark.master", "local[*]")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if str(master).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        self._started_here = SparkContext._active_spark_context is None
        super().setup_for_execution(context)
        self._spark_session.sparkContext.setLogLevel("WARN")

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._spark_session is None:
            return
        if self._started_here and self.stop_after_run:
            self._spark_session.stop()
            self._spark_session = None
            if context.log is not None:
                context.log.info("Stopped the SparkSession this run started.")
        elif context.log is not None:
            context.log.debug("Left the process's SparkSession running: this run did not start it.")


def spark_from_env(master: str | None = None, extra: dict[str, Any] | None = None) -> SparkResource:
    """``spark_conf(master)``: ``SPARK_MASTER`` or ``local[*]``; ``extra`` overrides settings."""
    conf = spark_conf(master, app_name="streamplatform-dagster", extra=extra)
    return SparkResource(spark_config=conf)
