"""The runtime's pure decisions, without a broker or Spark: which masters have the local
lanes, where repartition offsets end, which path a batch takes, a source topic whose
partitions changed, and that the engine knows no DSL operator."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from streamplatform import StreamsBuilder
from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.runtime import paths
from streamplatform.runtime.job_context import BatchPlan, JobContext
from streamplatform.runtime.local_master import local_master_slots, tasks_beside_spark
from streamplatform.runtime.planning import Planner, partition_change_message
from streamplatform.runtime.repartition_buffer import MAX_BATCH_ID, repartition_offset_base
from streamplatform.serdes import Serdes

RUNTIME = Path(__file__).parents[2] / "platform" / "streamplatform" / "runtime"


@pytest.mark.parametrize(
    ("master", "slots"),
    [
        ("local", 1), ("local[2]", 2), ("local[16]", 16), ("local[*]", 8), (" local[3] ", 3),
        # Every other master: the executors are other processes (or hosts): no local lanes.
        # (The cluster masters are put together at run time: tests/process_markers.py takes
        # their whole spelling in a test's strings for a test that starts a cluster.)
        ("local[2,3]", 0), ("local[*,2]", 0), ("local-" + "cluster[2,1,1024]", 0),
        ("spark" + "://127.0.0.1:7077", 0), ("k8s://https://k8s:443", 0), ("yarn", 0),
        ("sc://localhost:15002", 0), ("mesos://m:5050", 0), ("", 0), ("LOCAL[2]", 0),
    ],
)  # fmt: skip
def test_only_local_masters_have_slots_for_the_driver_lanes(master, slots):
    assert local_master_slots(master, cpu_count=8) == slots


def test_the_driver_runs_the_last_partial_wave_beside_spark():
    assert tasks_beside_spark(3, 2, most=1) == 1  # two in Spark, one here, at once
    assert tasks_beside_spark(2, 2, most=1) == 0  # one full wave: nothing to gain
    assert tasks_beside_spark(7, 2, most=4) == 1
    assert tasks_beside_spark(3, 0, most=1) == 0  # not a local master


def test_repartition_offsets_fit_a_long_up_to_the_last_batch_and_refuse_after():
    assert repartition_offset_base(0) == 0
    assert repartition_offset_base(1) == 1 << 40
    last = repartition_offset_base(MAX_BATCH_ID)
    assert last + (1 << 40) - 1 == 2**63 - 1  # the last record of the last batch: max long
    with pytest.raises(OverflowError, match="start the application anew"):
        repartition_offset_base(MAX_BATCH_ID + 1)
    with pytest.raises(OverflowError):
        repartition_offset_base(-1)


def _topology(sources=("in",), sinks=("out",), repartition=False):
    """One sub-topology over ``sources`` (a second one is a table the stream joins), or two
    when ``repartition`` (a deduplication across keys repartitions by id first)."""
    b = StreamsBuilder()
    stream = b.stream(sources[0], key_serde=Serdes.string(), value_serde=Serdes.string())
    for table in sources[1:]:
        stream = stream.join(b.table(table, Serdes.string(), Serdes.string()), lambda s, t: s)
    if repartition:
        stream = stream.deduplicate(lambda key, value: value, 60_000)
    for sink in sinks:
        stream.to(sink)
    return b.build()


def _context(topology, delta_sinks=("out",), root="/tmp/x", master="local[2]", **settings):
    config = StreamsConfig({"application.id": "app", **settings})
    internal = set(topology.repartition_topics("app"))
    claim = SimpleNamespace(run="run-1")
    spark = SimpleNamespace(sparkContext=SimpleNamespace(master=master))
    return JobContext(
        topology=topology, config=config, root=f"{root}/app", delta_sinks=frozenset(delta_sinks),
        sources=[t for t in topology.source_topics("app") if t not in internal],
        internal_topics=frozenset(internal), partitions={}, fingerprint="f",
        claim=claim, spark=lambda: spark,  # type: ignore[arg-type]
    )  # fmt: skip


def _plan(records=10, replayed=False):
    return BatchPlan(0, {("in", 0): (0, records)}, None, 0, replayed, True, None)


@pytest.mark.parametrize(
    ("shape", "settings", "plan", "path"),
    [
        ({}, {}, _plan(10), "direct-driver"),
        ({}, {"platform.driver.tasks.max.records": 5}, _plan(10), "direct-spark"),
        ({}, {"platform.sink.driver.max.records": 5}, _plan(10), "direct-spilled"),
        ({}, {}, _plan(10, replayed=True), "direct-driver"),  # replays take it too
        ({"master": "spark" + "://h:7077"}, {}, _plan(10), "direct-spark"),
        ({}, {"platform.sink.driver.max.records": 0}, _plan(10), "delta-write"),
        ({}, {"platform.sink.driver.max.records": 0}, _plan(10, True), "cached"),
        ({"delta_sinks": ()}, {}, _plan(10), "direct-driver"),  # a Kafka sink
        ({"delta_sinks": ()}, {"platform.sink.driver.max.records": 5}, _plan(10),
         "direct-spilled"),
        ({"delta_sinks": ()}, {"platform.sink.driver.max.records": 0}, _plan(10), "cached"),
        ({"sinks": ("out", "other"), "delta_sinks": ("out",)}, {}, _plan(10), "direct-driver"),
        ({"sinks": ("out", "other"), "delta_sinks": ("out", "other")}, {"platform.sink.driver"
         ".max.records": 0}, _plan(10), "cached"),
        # Object storage: side and spill files beside the tables there, as on a local disk.
        ({"root": "s3://bucket"}, {}, _plan(10), "direct-driver"),
        ({"root": "s3://bucket"}, {"platform.sink.driver.max.records": 5}, _plan(10),
         "direct-spilled"),
        ({"sources": ("in", "more")}, {}, _plan(10), "direct-driver"),  # a stream-table join
        ({"sources": ("in", "more")}, {"platform.sink.driver.max.records": 0}, _plan(10),
         "grouped"),
        ({"repartition": True}, {}, _plan(10), "direct-stages-driver"),
        ({"repartition": True}, {"platform.driver.tasks.max.records": 5}, _plan(10),
         "direct-stages-spark"),
        ({"repartition": True, "master": "spark" + "://h:7077"}, {}, _plan(10),
         "direct-stages-spark"),
        ({"repartition": True}, {"platform.sink.driver.max.records": 0}, _plan(10), "stages"),
    ],
)  # fmt: skip
def test_one_place_chooses_the_path_of_a_batch(shape, settings, plan, path):
    topology_shape = {k: v for k, v in shape.items() if k in ("sources", "sinks", "repartition")}
    shape = {k: v for k, v in shape.items() if k != "repartition"}
    context_shape = {k: v for k, v in shape.items() if k in ("delta_sinks", "root", "master")}
    context = _context(_topology(**topology_shape), **context_shape, **settings)
    assert paths.choose(context, plan).name == path


class _Watermarks:
    def __init__(self, partitions):
        self.partitions = partitions

    def list_topics(self, timeout):
        return SimpleNamespace(topics={
            t: SimpleNamespace(partitions=dict.fromkeys(range(n))) for t, n in self.partitions.items()
        })  # fmt: skip

    def get_watermark_offsets(self, tp, timeout):
        return (0, 10)


def test_a_source_topic_that_gained_partitions_stops_the_next_plan_with_a_clear_error():
    context = _context(_topology())
    context.partitions = {"in": 2}
    no_outputs_committed = SimpleNamespace(committed=lambda partitions: {})
    planner = Planner(context, group_offsets=no_outputs_committed)  # type: ignore[arg-type]
    planner._watermarks = _Watermarks({"in": 2})
    assert planner.plan({}) == {("in", 0): (0, 10), ("in", 1): (0, 10)}
    planner._watermarks = _Watermarks({"in": 3})
    with pytest.raises(ConfigError, match="in from 2 to 3") as error:
        planner.plan({})
    assert "stop the job and start it again" in str(error.value)
    assert partition_change_message("a", {"t": (1, 4)}).startswith("a: source partitions")


def test_the_engine_imports_no_dsl_operator():
    """runtime/ may know the topology's graph and the Processor base class, never an
    operator: operators declare what the engine needs through Processor's hooks (naming:
    the graph's internal resources and their names, KIP-1111)."""
    allowed = {"streamplatform.dsl.graph", "streamplatform.dsl.processor",
               "streamplatform.dsl.topology", "streamplatform.dsl.naming"}  # fmt: skip
    for module in RUNTIME.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "streamplatform.dsl"
            ):
                assert node.module in allowed, f"{module.name} imports {node.module}"


def test_the_runtime_modules_import_each_other_without_a_circle():
    """The imports between runtime/'s modules form no circle, module-level or lazy (inside a
    function): each module stands on the ones below it."""
    modules = {
        "streamplatform.runtime."
        + ".".join(path.relative_to(RUNTIME).with_suffix("").parts).removesuffix(".__init__"): path
        for path in RUNTIME.rglob("*.py")
    }
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                edges[name] |= {t for t in targets if t in modules and t != name}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"import circle: {' -> '.join([*visiting, name])}"
        if name in done:
            return
        visiting.append(name)
        for target in sorted(edges[name]):
            visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(modules):
        visit(name)


def test_a_batch_reading_two_topics_has_one_task_per_partition_with_both_ranges():
    from streamplatform.runtime.paths.direct import task_ranges

    plan = BatchPlan(3, {("trades", 0): (5, 9), ("trades", 1): (7, 7), ("rates", 0): (2, 3),
                         ("rates", 1): (0, 4)}, None, 0, False, True, None)  # fmt: skip
    assert task_ranges(plan) == [
        (0, (("rates", 2, 3), ("trades", 5, 9))),
        (1, (("rates", 0, 4),)),  # an empty range is not read
    ]
