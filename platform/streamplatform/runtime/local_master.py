"""What a local master lets the driver do itself: run a small batch's tasks in this process,
or the tasks of Spark's last, partial wave beside it.

Spark's local executors are threads of this process's JVM on this host, with this state dir
and this Python environment: a task run here is the same task Spark would run. On any other
master (``spark://``, ``k8s://``, ``yarn``, ``local-cluster[...]``, Spark Connect's ``sc://``)
the executors are other processes, perhaps other hosts, and these lanes are off.
"""

from __future__ import annotations

import os
import re

_LOCAL = re.compile(r"local(\[(\d+|\*)\])?")


def local_master_slots(master: str, cpu_count: int | None = None) -> int:
    """The task slots of a local master (``local``: 1, ``local[N]``: N, ``local[*]``: the
    cores); 0 for any other master. ``local[N,F]`` counts as other: Spark retries its tasks,
    which the driver's own are not."""
    local = _LOCAL.fullmatch(master.strip())
    if local is None:
        return 0
    if local.group(2) is None:
        return 1
    if local.group(2) == "*":
        return cpu_count or os.cpu_count() or 1
    return int(local.group(2))


def tasks_beside_spark(tasks: int, slots: int, most: int) -> int:
    """How many of a batch's ``tasks`` that Spark runs this process runs itself, at the same
    time: with fewer slots than tasks, the tasks of Spark's last, partial wave (tasks mod
    slots), which would run alone while a core idles; at most ``most``. Three tasks on
    local[2]: one here, two in Spark, the three at once instead of two waves."""
    if slots == 0 or tasks <= slots:
        return 0
    return min(tasks % slots, most)
