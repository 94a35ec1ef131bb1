"""docs/semantics.md's limits on tags and settings: errors name the setting (and the instance) to fix."""

from __future__ import annotations

import pytest

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.placement import assign, inputs_from_settings, plan_standbys

CLIENTS = {"a": {"zone": "z1"}, "b": {"zone": "z2"}}
ACTIVE = {"0_0": "a"}


def placement_error(**overrides) -> str:
    arguments = {
        "clients": CLIENTS,
        "active": ACTIVE,
        "num_standby_replicas": 1,
        "awareness": ["zone"],
    } | overrides
    with pytest.raises(ConfigError) as raised:
        plan_standbys(**arguments)
    return str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"num_standby_replicas": -1}, "num.standby.replicas=-1: expected an integer >= 0"),
        ({"num_standby_replicas": True}, "num.standby.replicas=True"),
        ({"num_standby_replicas": "2"}, "num.standby.replicas='2'"),
        ({"clients": {"a": {f"k{i}": "v" for i in range(6)}}, "awareness": []},
         "client.tag.*: instance 'a' has 6 tags, at most 5"),
        ({"clients": {"a": {"k" * 21: "v"}}, "awareness": []},
         f"client.tag.{'k' * 21}: tag keys are at most 20 characters (instance 'a')"),
        ({"clients": {"a": {"zone": "v" * 31}}},
         f"client.tag.zone={'v' * 31}: tag values are at most 30 characters (instance 'a')"),
        ({"clients": {"a": {"zone": ""}}}, "client.tag.zone: instance 'a' needs a non-empty"),
        ({"awareness": ["zone", "rack"]},
         "rack.aware.assignment.tags: 'rack' must be a tag of every instance; set "
         "client.tag.rack on 'a', 'b'"),
        ({"clients": {"a": {"zone": "z1"}, "b": {}}},
         "rack.aware.assignment.tags: 'zone' must be a tag of every instance; set "
         "client.tag.zone on 'b'"),
        ({"awareness": ["zone", "zone"]}, "rack.aware.assignment.tags: 'zone' is listed twice"),
        ({"active": {"0_0": "ghost"}}, "active: task '0_0' is on unknown instance 'ghost'"),
        ({"capacity": {"a": 0}}, "capacity of 'a'=0: expected an integer >= 1"),
        ({"capacity": {"ghost": 1}}, "capacity: unknown instance 'ghost'"),
        ({"stateful_tasks": ["9_9"]}, "stateful_tasks: task '9_9' has no active instance"),
    ],
)  # fmt: skip
def test_errors_name_the_setting(overrides, expected):
    assert expected in placement_error(**overrides)


def test_the_limits_themselves_are_allowed():
    clients = {
        "a": {f"k{i}": "v" for i in range(4)} | {"k" * 20: "v" * 30},
        "b": {f"k{i}": "w" for i in range(4)} | {"k" * 20: "w" * 30},
    }
    placement = plan_standbys(clients, ACTIVE, 1, ["k" * 20, "k0"])
    assert placement.standbys == {"0_0": ["b"]}


def test_all_problems_are_reported_together():
    message = placement_error(num_standby_replicas=-1, active={"0_0": "ghost"})
    assert "num.standby.replicas" in message
    assert "unknown instance 'ghost'" in message


def test_a_long_list_of_problems_is_capped():
    message = placement_error(active={f"0_{p}": "ghost" for p in range(50)})
    assert "... and 30 more" in message


def test_awareness_as_the_setting_s_comma_separated_string():
    assert plan_standbys(CLIENTS, ACTIVE, 1, " zone , ").standbys == {"0_0": ["b"]}


def test_assign_rejects_duplicate_tasks_and_no_instances():
    with pytest.raises(ConfigError, match="tasks: '0_0' is listed twice"):
        assign(CLIENTS, ["0_0", "0_0"], 1, ["zone"])
    with pytest.raises(ConfigError, match="no instances"):
        assign({}, ["0_0"], 0, [])


def test_inputs_from_each_instance_s_settings():
    base = {"application.id": "app", "num.standby.replicas": 2}
    inputs = inputs_from_settings(
        {
            "a": base | {"client.tag.zone": "z1", "rack.aware.assignment.tags": "zone"},
            "b": StreamsConfig(
                base | {"instance.tag.zone": "z2", "standby.task.assignment.awareness": ["zone"]}
            ),
        }
    )
    assert inputs.clients == {"a": {"zone": "z1"}, "b": {"zone": "z2"}}
    assert (inputs.num_standby_replicas, inputs.awareness) == (2, ("zone",))


def test_inputs_from_settings_name_the_setting_and_the_instance():
    with pytest.raises(ConfigError) as raised:
        inputs_from_settings(
            {
                "a": {"application.id": "app", "num.standby.replicas": 1},
                "b": {"application.id": "app", "num.standby.replicas": 2},
                "c": {"application.id": "app", "num.standby.replicas": 1, "client.tag.x": "v" * 31},
            }
        )
    message = str(raised.value)
    assert "num.standby.replicas: every instance must use the same value" in message
    assert "instance 'c'" in message
    assert "client.tag.x: tag values are at most 30 characters" in message
