"""What a placement becomes: the fair-scheduler file, Spark settings per instance, the printed
plan of ``streamplatform placement plan``, and the placements Delta table (one Spark test)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from streamplatform.cli import main
from streamplatform.placement import (
    assign,
    executor_settings,
    fair_scheduler_xml,
    plan_standbys,
    write_placements,
)
from streamplatform.placement.spark_outputs import placement_rows

CLIENTS = {
    "node-1": {"zone": "eu-1a", "cluster": "k8s-1"},
    "node-2": {"zone": "eu-1b", "cluster": "k8s-1"},
    "node-3": {"zone": "eu-1a", "cluster": "k8s-2"},
    "node-4": {"zone": "eu-1b", "cluster": "k8s-2"},
}

INSTANCES_YAML = """\
instances:
  node-1: {tags: {zone: eu-1a, cluster: k8s-1}, capacity: 2}
  node-2: {tags: {zone: eu-1b, cluster: k8s-1}}
  node-3: {tags: {zone: eu-1a, cluster: k8s-2}}
  node-4: {tags: {zone: eu-1b, cluster: k8s-2}}
num_standby_replicas: 1
awareness: [zone, cluster]
tasks: 10
"""


def test_allocation_file_has_one_weighted_pool_per_instance():
    root = ET.fromstring(fair_scheduler_xml({"node-2": 1, "node-1": 3, "a&b": 2}))
    assert root.tag == "allocations"
    pools = {pool.get("name"): pool for pool in root.findall("pool")}
    assert list(pools) == ["a&b", "node-1", "node-2"]
    assert {name: pool.findtext("weight") for name, pool in pools.items()} == {
        "a&b": "2",
        "node-1": "3",
        "node-2": "1",
    }
    assert {pool.findtext("schedulingMode") for pool in pools.values()} == {"FAIR"}


def test_settings_per_instance_select_nodes_by_tag():
    settings = executor_settings(
        CLIENTS,
        allocation_file="/tmp/pools.xml",
        node_labels={"zone": "topology.kubernetes.io/zone"},
    )
    assert list(settings) == ["node-1", "node-2", "node-3", "node-4"]
    assert settings["node-3"] == {
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.pool": "node-3",
        "spark.scheduler.allocation.file": "/tmp/pools.xml",
        "spark.kubernetes.executor.node.selector.cluster": "k8s-2",
        "spark.kubernetes.executor.node.selector.topology.kubernetes.io/zone": "eu-1a",
    }


def test_rows_one_per_copy_with_the_task_level():
    placement = plan_standbys(
        CLIENTS, {"0_0": "node-1", "0_1": "node-2"}, 2, ["zone", "cluster"], stateful_tasks=["0_0"]
    )
    assert placement_rows(placement, 7) == [
        (7, "0_0", "active", "node-1", "least_preferred"),
        (7, "0_0", "standby", "node-4", "least_preferred"),
        (7, "0_0", "standby", "node-3", "least_preferred"),
        (7, "0_1", "active", "node-2", None),
    ]


def test_cli_prints_the_plan_as_an_aligned_table(tmp_path, capsys):
    instances = tmp_path / "instances.yaml"
    instances.write_text(INSTANCES_YAML)
    assert main(["placement", "plan", "--instances", str(instances)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[0]
    assert header.split() == ["task", "active", "standbys", "level"]
    task_lines = lines[1 : lines.index("")]
    assert [line.split()[0] for line in task_lines] == [f"0_{p}" for p in range(10)]
    for line in task_lines:  # columns line up under their headers
        for column in ("active", "standbys", "level"):
            assert line[header.index(column) - 1] == " "
            assert line[header.index(column)] != " "
    # node-1 has capacity 2: it takes twice the actives of the others.
    assert "node-1    cluster=k8s-1,zone=eu-1a  2         4" in out
    assert "levels: absolute 10, partial 0, least_preferred 0, unplaced 0" in out
    assert "standbys per instance: min" in out


def test_cli_options_override_the_file(tmp_path, capsys):
    instances = tmp_path / "instances.yaml"
    instances.write_text(INSTANCES_YAML)
    argv = ["placement", "plan", "--instances", str(instances), "--tasks", "3", "--standbys", "2"]
    assert main([*argv, "--strict"]) == 0
    out = capsys.readouterr().out
    assert "levels: absolute 0, partial 0, least_preferred 0, unplaced 3" in out
    assert main([*argv, "--awareness", "zone"]) == 0
    assert "least_preferred 3" in capsys.readouterr().out


def test_cli_keeps_given_actives(tmp_path, capsys):
    instances = tmp_path / "instances.yaml"
    instances.write_text(INSTANCES_YAML.replace("tasks: 10", 'active: {"0_0": node-4}'))
    assert main(["placement", "plan", "--instances", str(instances)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == [
        "0_0",
        "node-4",
        "node-1",
        "absolute",
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (INSTANCES_YAML.replace("[zone, cluster]", "[zone, rack]"),
         "rack.aware.assignment.tags: 'rack' must be a tag of every instance"),
        (INSTANCES_YAML.replace("num_standby_replicas: 1", "num_standby_replicas: -2"),
         "num.standby.replicas=-2"),
        (INSTANCES_YAML.replace("tasks: 10", "tasks: [0_1]"), "task ids must be quoted strings"),
        (INSTANCES_YAML.replace("tasks: 10", "task: 10"), "unknown keys ['task']"),
        ("instances: [a, b]\n", "expected a mapping with an 'instances' mapping"),
    ],
)  # fmt: skip
def test_cli_errors_name_the_file_and_the_setting(tmp_path, content, expected):
    instances = tmp_path / "instances.yaml"
    instances.write_text(content)
    with pytest.raises(SystemExit) as raised:
        main(["placement", "plan", "--instances", str(instances)])
    assert str(instances) in str(raised.value)
    assert expected in str(raised.value)


@pytest.mark.spark
def test_placements_delta_table_counts_generations(spark, tmp_path):
    path = tmp_path / "placements"
    first = assign(CLIENTS, ["0_0", "0_1"], 1, ["zone", "cluster"])
    second = assign(CLIENTS, ["0_0", "0_1", "0_2"], 2, ["zone", "cluster"])
    assert write_placements(spark, first, path) == 1
    assert write_placements(spark, second, path) == 2
    rows = spark.read.format("delta").load(str(path)).collect()
    by_generation = {
        generation: sorted(
            (r.task, r.role, r.client, r.level) for r in rows if r.generation == generation
        )
        for generation in (1, 2)
    }
    assert {r.generation for r in rows} == {1, 2}
    assert by_generation[1] == sorted(row[1:] for row in placement_rows(first, 1))
    assert by_generation[2] == sorted(row[1:] for row in placement_rows(second, 2))
    assert sum(role == "standby" for _, role, _, _ in by_generation[2]) == 6
