"""The C extensions of the package (pyproject.toml holds everything else).

``streamplatform.dsl._dedup_core`` is the dedup processor's per-record path in C,
``streamplatform.dsl._window_core`` the time-windowed aggregation's,
``streamplatform.dsl._join_core`` the stream-stream windowed join's,
``streamplatform.dsl._table_join_core`` the table-table join's,
``streamplatform.dsl._session_core`` the session aggregation's,
``streamplatform.dsl._sliding_core`` the sliding-window aggregation's,
``streamplatform.state._sorted_keys`` keeps a transaction's staged keys in order,
``streamplatform.runtime._kafka_rows`` turns a task's consumed Kafka messages into its record
tuples, ``streamplatform.runtime._task_loop`` is a task's loop over its records, its sinks'
writes, its source records' decoding and its output columns' Arrow buffers, and
``streamplatform.registry._avro_core`` reads Avro values in bulk. Without them the same code
runs in its pure-Python reference, which gives the same results, slower (dsl/dedup.py,
dsl/window_aggregate.py, dsl/stream_join.py, dsl/table_join.py, dsl/session_aggregate.py,
dsl/sliding_aggregate.py, runtime/kafka_input.py, runtime/task.py, runtime/sink_writers.py,
runtime/source_records.py, runtime/rows.py, state/overlay.py, registry/serdes.py with
fastavro).

The cores are expected: an install whose C build fails **fails**, with a message saying why and
what to do, instead of going on without it. (A warning would not do: ``pip install --quiet``,
as ``make setup`` runs it, shows a build's output only when the build fails, so a failed
optional build used to pass unseen and leave the slow path running.)

To install without the C core on purpose (no C compiler on the machine), set
``STREAMPLATFORM_NO_C_CORE=1``: the extension is then not built at all. Set it where the tests
run too: ``tests/dsl/test_dedup_core.py`` fails when a core is missing unless it is set.

Rebuilding after a change to a ``.c`` file: ``make setup`` (it reinstalls when the source
or this file changed), or in place ``.venv/bin/python setup.py build_ext --inplace``.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPT_OUT = "STREAMPLATFORM_NO_C_CORE"
CORES_H = "platform/streamplatform/dsl/_cores.h"  # what the DSL's cores share


def _opted_out() -> bool:
    return os.environ.get(OPT_OUT, "").strip().lower() in {"1", "true", "yes"}


class BuildCCore(build_ext):
    """build_ext that builds the C core or fails saying so, unless ``$STREAMPLATFORM_NO_C_CORE``
    asks for no core."""

    def run(self) -> None:
        if _opted_out():
            self.announce(f"{OPT_OUT} is set: not building the C cores", level=2)
            self.extensions = []
        super().run()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            from setuptools.errors import CompileError

            raise CompileError(
                f"\n\nBuilding the C core {ext.name} (from {', '.join(ext.sources)}) "
                f"failed: {error}\n"
                "Install a C compiler and Python's headers (e.g. `apt-get install gcc "
                "python3-dev`, or `xcode-select --install`) and install again, or set "
                f"{OPT_OUT}=1 to install without it (the pure-Python core then runs: the same "
                "results, slower).\n"
            ) from error


setup(
    cmdclass={"build_ext": BuildCCore},
    ext_modules=[
        Extension(
            "streamplatform.dsl._dedup_core",
            sources=["platform/streamplatform/dsl/_dedup_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.dsl._window_core",
            sources=["platform/streamplatform/dsl/_window_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.dsl._join_core",
            sources=["platform/streamplatform/dsl/_join_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.dsl._table_join_core",
            sources=["platform/streamplatform/dsl/_table_join_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.dsl._session_core",
            sources=["platform/streamplatform/dsl/_session_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.dsl._sliding_core",
            sources=["platform/streamplatform/dsl/_sliding_core.c"],
            depends=[CORES_H],
        ),
        Extension(
            "streamplatform.runtime._kafka_rows",
            sources=["platform/streamplatform/runtime/_kafka_rows.c"],
        ),
        Extension(  # overlay.SortedKeys in C: a transaction's staged keys in order
            "streamplatform.state._sorted_keys",
            sources=["platform/streamplatform/state/_sorted_keys.c"],
        ),
        Extension(
            "streamplatform.runtime._task_loop",
            sources=["platform/streamplatform/runtime/_task_loop.c"],
            depends=[CORES_H],
        ),
        Extension(  # the compiled Avro reader of the registry's Avro serde (avro_program.py)
            "streamplatform.registry._avro_core",
            sources=["platform/streamplatform/registry/_avro_core.c"],
        ),
    ],
)
