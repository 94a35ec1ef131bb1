"""Checks on the assignor's inputs, per docs/semantics.md, with errors that name the setting to fix.

The limits are StreamsConfig's (``MAX_CLIENT_TAGS``, ``MAX_TAG_KEY_LENGTH``,
``MAX_TAG_VALUE_LENGTH``); the error type is its :class:`~streamplatform.config.ConfigError`.
All problems are reported together, as StreamsConfig does, capped at :data:`MAX_LISTED` lines.

:func:`inputs_from_settings` builds the assignor's inputs from each instance's own settings
(``client.tag.<key>``, ``rack.aware.assignment.tags``, ``num.standby.replicas``), so that a
placement can be planned from the same dictionaries the instances start with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streamplatform.config import (
    CLIENT_TAG_PREFIX,
    MAX_CLIENT_TAGS,
    MAX_TAG_KEY_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    ConfigError,
    StreamsConfig,
)

MAX_LISTED = 20
AWARENESS = "rack.aware.assignment.tags"
STANDBYS = "num.standby.replicas"


def awareness_keys(awareness: str | Iterable[str]) -> tuple[str, ...]:
    """The awareness keys as a tuple; a string is read like the setting, comma-separated."""
    if isinstance(awareness, str):
        return tuple(key.strip() for key in awareness.split(",") if key.strip())
    return tuple(awareness)


def _raise(errors: list[str]) -> None:
    if not errors:
        return
    listed = errors[:MAX_LISTED]
    if len(errors) > MAX_LISTED:
        listed.append(f"... and {len(errors) - MAX_LISTED} more")
    raise ConfigError("Invalid placement inputs:\n  " + "\n  ".join(listed))


def _tag_errors(client: str, tags: Mapping[str, str]) -> list[str]:
    errors = []
    if len(tags) > MAX_CLIENT_TAGS:
        errors.append(
            f"{CLIENT_TAG_PREFIX}*: instance {client!r} has {len(tags)} tags, "
            f"at most {MAX_CLIENT_TAGS} are allowed"
        )
    for key, value in tags.items():
        setting = f"{CLIENT_TAG_PREFIX}{key}"
        if not isinstance(key, str) or not key:
            errors.append(f"{setting}: instance {client!r} has a tag without a key")
        elif len(key) > MAX_TAG_KEY_LENGTH:
            errors.append(
                f"{setting}: tag keys are at most {MAX_TAG_KEY_LENGTH} characters "
                f"(instance {client!r})"
            )
        elif not isinstance(value, str) or not value:
            errors.append(f"{setting}: instance {client!r} needs a non-empty string value")
        elif len(value) > MAX_TAG_VALUE_LENGTH:
            errors.append(
                f"{setting}={value}: tag values are at most {MAX_TAG_VALUE_LENGTH} characters "
                f"(instance {client!r})"
            )
    return errors


def validate_inputs(
    clients: Mapping[str, Mapping[str, str]],
    active: Mapping[str, str],
    num_standby_replicas: int,
    awareness: tuple[str, ...],
    capacity: Mapping[str, int] | None,
    stateful_tasks: Iterable[str] | None,
) -> None:
    """Raise :class:`ConfigError` listing every problem with the assignor's inputs."""
    errors: list[str] = []
    if (
        isinstance(num_standby_replicas, bool)
        or not isinstance(num_standby_replicas, int)
        or num_standby_replicas < 0
    ):
        errors.append(f"{STANDBYS}={num_standby_replicas!r}: expected an integer >= 0")
    for client, tags in clients.items():
        errors += _tag_errors(client, tags)
    for position, key in enumerate(awareness):
        if key in awareness[:position]:
            errors.append(f"{AWARENESS}: {key!r} is listed twice")
            continue
        lacking = [client for client, tags in clients.items() if key not in tags]
        if lacking:
            shown = ", ".join(repr(client) for client in lacking[:5])
            more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
            errors.append(
                f"{AWARENESS}: {key!r} must be a tag of every instance; set "
                f"{CLIENT_TAG_PREFIX}{key} on {shown}{more}"
            )
    for task, client in active.items():
        if client not in clients:
            errors.append(f"active: task {task!r} is on unknown instance {client!r}")
    for client, threads in (capacity or {}).items():
        if client not in clients:
            errors.append(f"capacity: unknown instance {client!r}")
        elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            errors.append(f"capacity of {client!r}={threads!r}: expected an integer >= 1")
    for task in stateful_tasks or ():
        if task not in active:
            errors.append(f"stateful_tasks: task {task!r} has no active instance")
    _raise(errors)


def validate_tasks(clients: Mapping[str, Mapping[str, str]], tasks: list[str]) -> None:
    """Tasks to place with :func:`~streamplatform.placement.assign`: unique, and somewhere to go."""
    seen: set[str] = set()
    errors = []
    for task in tasks:
        if task in seen:
            errors.append(f"tasks: {task!r} is listed twice")
        seen.add(task)
    if tasks and not clients:
        errors.append("clients: no instances to place tasks on")
    _raise(errors)


@dataclass(frozen=True)
class PlacementInputs:
    """The instance-level inputs of the assignor, as read from the instances' settings."""

    clients: dict[str, dict[str, str]]
    num_standby_replicas: int
    awareness: tuple[str, ...]


def inputs_from_settings(
    settings_by_instance: Mapping[str, Mapping[str, Any] | StreamsConfig],
) -> PlacementInputs:
    """Read every instance's settings (a dict or a StreamsConfig) into assignor inputs.

    Tags come from ``client.tag.<key>`` (alias ``instance.tag.<key>``); all instances must agree
    on ``num.standby.replicas`` and ``rack.aware.assignment.tags`` (alias
    ``standby.task.assignment.awareness``), which are one application's settings.

    >>> inputs = inputs_from_settings({
    ...     "a": {"application.id": "app", "client.tag.zone": "z1", "num.standby.replicas": 1,
    ...           "rack.aware.assignment.tags": "zone"},
    ...     "b": {"application.id": "app", "instance.tag.zone": "z2", "num.standby.replicas": 1,
    ...           "standby.task.assignment.awareness": ["zone"]},
    ... })
    >>> inputs.clients, inputs.num_standby_replicas, inputs.awareness
    ({'a': {'zone': 'z1'}, 'b': {'zone': 'z2'}}, 1, ('zone',))
    """
    errors: list[str] = []
    configs: dict[str, StreamsConfig] = {}
    for instance, settings in settings_by_instance.items():
        try:
            configs[instance] = (
                settings if isinstance(settings, StreamsConfig) else StreamsConfig(settings)
            )
        except ConfigError as exc:
            errors.append(f"instance {instance!r}: {exc}")
    for setting in (STANDBYS, AWARENESS):
        values = {instance: config[setting] for instance, config in configs.items()}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{instance}={value!r}" for instance, value in values.items())
            errors.append(f"{setting}: every instance must use the same value, got {listed}")
    _raise(errors)
    first = next(iter(configs.values()), None)
    return PlacementInputs(
        clients={instance: dict(config.client_tags) for instance, config in configs.items()},
        num_standby_replicas=int(first[STANDBYS]) if first is not None else 0,
        awareness=tuple(first[AWARENESS]) if first is not None else (),
    )
