"""The one C extension of the package (pyproject.toml holds everything else).

``streamplatform.dsl._dedup_core`` is the dedup processor's per-record path in C. It is
optional: where it cannot be built (no C compiler), the install goes on without it and the
processor runs its pure-Python core, which gives the same results (dsl/dedup.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamplatform.dsl._dedup_core",
            sources=["platform/streamplatform/dsl/_dedup_core.c"],
            optional=True,
        )
    ]
)
