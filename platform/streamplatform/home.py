"""Where the project's generated folders live: the JVM jars (.jvm/) and local data (.data/).

The JVM jars are the platform's: they come from its *home* directory,

1. ``STREAMPLATFORM_HOME`` when set;
2. otherwise the source checkout this package was installed from (editable install), recognised
   by ``platform/jvm/pom.xml``;
3. otherwise the current working directory.

Local data is the project's that runs: ``.data/`` in the folder a command runs in (a team's
own project), or ``STREAMPLATFORM_HOME/.data`` when that is set; ``STREAMPLATFORM_DATA`` moves
it anywhere (tests use it to stay out of ``.data/``).
``STREAMPLATFORM_STATE_DIR`` moves only the default task state, on the machine it is set on.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]


def project_home() -> Path:
    """The folder that holds ``.jvm/`` and ``.data/``."""
    configured = os.environ.get("STREAMPLATFORM_HOME")
    if configured:
        return Path(configured).resolve()
    if (_CHECKOUT / "platform" / "jvm" / "pom.xml").is_file():
        return _CHECKOUT
    return Path.cwd()


def jvm_dir(classpath: str) -> Path:
    """One of the Maven-fetched classpaths: ``spark`` or ``kafka`` (see platform/jvm/pom.xml)."""
    return project_home() / ".jvm" / classpath


def data_dir() -> Path:
    """Local data: Delta tables, broker logs, Dagster's instance, state stores.

    ``STREAMPLATFORM_DATA``, else ``STREAMPLATFORM_HOME/.data``, else ``.data/`` in the folder
    the command runs in: a team's own project keeps its data, never the platform's install.
    (Run from inside the platform's source checkout, that is the checkout's ``.data/``.)"""
    configured = os.environ.get("STREAMPLATFORM_DATA")
    if configured:
        return Path(configured).resolve()
    if os.environ.get("STREAMPLATFORM_HOME"):
        return project_home() / ".data"
    here = Path.cwd().resolve()
    return (_CHECKOUT if here.is_relative_to(_CHECKOUT) else here) / ".data"


def default_state_dir() -> Path:
    """Where task state lives when ``state.dir`` is not set, resolved where the task runs (an
    executor on a cluster): ``STREAMPLATFORM_STATE_DIR`` when set there (a worker's own local
    disk), else ``<data dir>/state``."""
    configured = os.environ.get("STREAMPLATFORM_STATE_DIR")
    return Path(configured).resolve() if configured else data_dir() / "state"


def jars_in(classpath: str) -> list[Path]:
    """The jars of a classpath, or an error that says how to fetch them."""
    folder = jvm_dir(classpath)
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(
            f"No JVM jars in {folder}: run `make setup` in {project_home()} to fetch them "
            "with Maven (platform/jvm/pom.xml)."
        )
    return jars
