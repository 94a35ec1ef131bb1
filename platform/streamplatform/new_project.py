"""``streamplatform new <dir>``: a team's own small project that works as written.

What it writes: a ``pyproject.toml`` with the platform as a dependency, a topology module (a
dedup of clicks by id within 10 minutes into a Delta table, bad records to a DLQ), a test of it
on the ``TopologyTestDriver``, a Dagster ``definitions.py`` for the same job, and a README whose
commands run the test, start a local broker from the project folder, feed it and run the job
(its data under the project's ``.data/``, never in the platform's install).
"""

from __future__ import annotations

import re
from pathlib import Path

_PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"
# The platform: installed from its source checkout (pip install -e <checkout>) or its index.
dependencies = ["streamplatform"]

[tool.pytest.ini_options]
pythonpath = ["."]
"""

_TOPOLOGY = '''\
"""The clicks job: each click once (deduplicated by its id within 10 minutes, per user), into a
Delta table; a click that is not JSON goes to the DLQ topic."""

from datetime import timedelta

from streamplatform import StreamsBuilder, Topology
from streamplatform.serdes import Serdes

CLICKS = "clicks"
DEDUPLICATED = "clicks-deduplicated"
DLQ = "clicks-dlq"


def build() -> Topology:
    builder = StreamsBuilder()
    clicks = builder.stream(CLICKS, Serdes.string(), Serdes.json())
    clicks.deduplicate_by_key_value(lambda user, click: click["id"], timedelta(minutes=10)).to(
        DEDUPLICATED
    )
    return builder.build()
'''

_TEST = '''\
"""The clicks job on the TopologyTestDriver: what it will do on Spark."""

from {package}.topology import CLICKS, DEDUPLICATED, build
from streamplatform import TopologyTestDriver
from streamplatform.serdes import Serdes


def test_a_click_sent_twice_is_kept_once():
    with TopologyTestDriver(build(), {{"application.id": "clicks"}}) as driver:
        clicks = driver.create_input_topic(CLICKS, Serdes.string(), Serdes.json())
        out = driver.create_output_topic(DEDUPLICATED, Serdes.string(), Serdes.json())
        clicks.pipe_input("ada", {{"id": "c1", "page": "/home"}}, timestamp=0)
        clicks.pipe_input("ada", {{"id": "c1", "page": "/home"}}, timestamp=1_000)
        clicks.pipe_input("ada", {{"id": "c2", "page": "/cart"}}, timestamp=2_000)
        assert [value["id"] for value in out.read_values_to_list()] == ["c1", "c2"]
'''

_DEFINITIONS = '''\
"""The clicks job in Dagster: `dagster dev -f definitions.py` (a local broker running)."""

from {package}.topology import DEDUPLICATED, DLQ, build
from streamplatform.dagster import StreamingJobSpec, StreamplatformResource, streaming_definitions

defs = streaming_definitions(
    [StreamingJobSpec(name="clicks_deduplicated", topology=build, delta_sinks=[DEDUPLICATED],
                      dlq_topic=DLQ)],
    resource=StreamplatformResource(),
)
'''

_README = """\
# {name}

A streaming job on streamplatform: clicks deduplicated by id within 10 minutes
(`{package}/topology.py`), tested on the `TopologyTestDriver` (`tests/`), run on Spark by
`streamplatform run` or from Dagster (`definitions.py`). Local data (the broker's, the Delta
tables, the state) goes to `.data/` in this folder.

With streamplatform installed in your environment (`pip install -e <platform checkout>`, whose
`make setup` also fetched the jars), from this folder:

```bash
pytest -q
streamplatform broker start
streamplatform topics create clicks --partitions 3
streamplatform topics create clicks-dlq
printf '%s\\n' \\
  '{{"key": "ada", "value": {{"id": "c1"}}, "timestamp": "2026-01-01T12:00:00Z"}}' \\
  '{{"key": "ada", "value": {{"id": "c1"}}, "timestamp": "2026-01-01T12:00:05Z"}}' \\
  '{{"key": "bob", "value": {{"id": "c2"}}, "timestamp": "2026-01-01T12:00:07Z"}}' \\
  | streamplatform topics produce clicks --json-lines --value-serde json
streamplatform run --topology {package}.topology:build --set application.id=clicks \\
  --set errors.dead.letter.queue.topic.name=clicks-dlq \\
  --delta-sink clicks-deduplicated --until-caught-up
streamplatform broker stop
```

The deduplicated clicks are then the Delta table `.data/delta/clicks/clicks-deduplicated`.
In Dagster: `dagster dev -f definitions.py` with the broker running.
"""


def create(directory: Path) -> list[Path]:
    """Write the project into ``directory`` (created; it must be empty or absent). Returns the
    files written."""
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty: give a new or empty folder")
    name = directory.resolve().name
    package = re.sub(r"\W", "_", name.lower()).strip("_") or "project"
    if package[0].isdigit():
        package = f"project_{package}"
    files = {
        "pyproject.toml": _PYPROJECT.format(name=name),
        f"{package}/__init__.py": "",
        f"{package}/topology.py": _TOPOLOGY,
        "tests/test_topology.py": _TEST.format(package=package),
        "definitions.py": _DEFINITIONS.format(package=package),
        "README.md": _README.format(name=name, package=package),
        ".gitignore": ".data/\n.venv/\n__pycache__/\n",
    }
    written = []
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
