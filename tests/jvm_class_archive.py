"""A class-data-sharing archive for the test run's Spark driver JVMs (JDK 17's dynamic CDS).

A Spark driver JVM spends most of its start loading and verifying Spark's, Hadoop's and
Parquet's classes: a session plus its first Delta write took ~18-21 s on the 2-core machine,
~11-12.5 s with the classes mapped from an archive (alternating runs). The crash-point,
CLI, cluster and Dagster tests start a few hundred such JVMs, so the run builds the archive
once (one short Spark job in a child process, ~30 s), keeps it under ``.data/cds/`` and gives
every later JVM ``-XX:SharedArchiveFile`` through ``$SPARK_SUBMIT_OPTS``.

It changes no semantics: an archive holds parsed classes only. A JVM whose class path or
build differs from the archive's (the Spark Connect server's, the cluster's daemons', another
JDK) ignores it and loads classes as usual; its CDS messages are off, so no child's stdout
carries them. The archive's file name is a hash of what it depends on (the JVM, the jars, the
flags), so a changed jar or JDK builds a new one instead of being silently slower.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHIVE_DIR = REPO / ".data" / "cds"
# Off: a JVM that cannot use the archive would say so on its stdout (JDK 17 logs there).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# The archived job: a session, a Delta write and read, a Python UDF over Arrow (the tasks'
# path): the classes every test job loads. What it does not load, a JVM loads from its jars.
_JOB = """
import sys
import pyarrow as pa
from streamplatform.spark import spark_session

spark = spark_session(master="local[2]", app_name="class-archive")
path = sys.argv[1]
spark.range(1000).selectExpr("id", "cast(id as string) as s").write.format("delta").save(path)
frame = spark.read.format("delta").load(path)
frame.mapInArrow(lambda batches: (b for b in batches), frame.schema).toArrow()
frame.groupBy("s").count().collect()
spark.stop()
"""


def _key(base_options: str) -> str:
    """What the archive depends on: the JVM's build, the jars on the driver's class path and
    in ``spark.jars``, and the JVM options it was dumped with."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    digest = hashlib.sha256(java.stderr.encode() + base_options.encode())
    jar_dirs = [
        Path(pyspark.__file__).parent / "jars",
        REPO / ".jvm" / "spark",
        REPO / ".jvm" / "s3",
    ]
    for directory in jar_dirs:
        for jar in sorted(directory.glob("*.jar")):
            digest.update(f"{jar}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _dump(archive: Path, base_options: str) -> str | None:
    """Run the archived job with ``-XX:ArchiveClassesAtExit``; None when the archive was
    written, else what went wrong (the run goes on without one)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        partial = Path(scratch) / "spark.jsa"
        env = os.environ | {
            "SPARK_SUBMIT_OPTS": f"{base_options} -XX:ArchiveClassesAtExit={partial}",
            "SPARK_LOCAL_DIRS": scratch,
        }
        try:
            done = subprocess.run(
                [sys.executable, "-c", _JOB, f"{scratch}/table"], env=env, cwd=scratch,
                capture_output=True, text=True, timeout=300, start_new_session=True,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return "the archived job took more than 300 s"
        if done.returncode != 0 or not partial.exists():
            return f"the archived job failed ({done.returncode}): {done.stderr[-800:]}"
        partial.replace(archive)  # atomic: a concurrent run sees a whole archive or none
    return None


def prepare(base_options: str, build: bool) -> tuple[str, str]:
    """The JVM options that use the archive for ``base_options``' JVMs ("" when there is none
    and ``build`` is False, or building failed), and a line saying what happened.
    ``$NO_CLASS_ARCHIVE`` turns it off (to compare, or to rule it out)."""
    if os.environ.get("NO_CLASS_ARCHIVE"):
        return "", "no class archive for Spark's JVMs: NO_CLASS_ARCHIVE is set"
    try:
        archive = ARCHIVE_DIR / f"spark-{_key(base_options)}.jsa"
    except (OSError, subprocess.CalledProcessError) as error:
        return "", f"no class archive for Spark's JVMs: {error}"
    if not archive.exists():
        if not build:
            return "", "no class archive for Spark's JVMs (built by a run with child drivers)"
        failure = _dump(archive, base_options)
        if failure is not None:
            return "", f"no class archive for Spark's JVMs: {failure}"
        verb = "built"
    else:
        verb = "reused"
    return (
        f"-XX:SharedArchiveFile={archive} {QUIET}",
        f"class archive for Spark's JVMs {verb}: {archive}",
    )
