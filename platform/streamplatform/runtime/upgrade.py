"""Upgrades that never drop state silently: a job's stores against its last commit's.

Each commit records the job's **store layout** (a JSON column of the commit log): every store
with its kind, key and value serdes, changelog topic, sub-topology and operator, and every
repartition topic with its serdes. At start (the first read of the commit log), the job
compares its own layout with the last commit's and refuses, with ``UpgradeRefused``, a change
that would lose state without a word:

- a store of the last commit is gone: its state would be left behind (orphaned). When a store
  of the same shape is new (the same operator kind, another index: an operator was added or
  removed upstream of an unnamed stateful operator), the message pairs them: that is a rename,
  and the new store would start empty;
- a store is new while a store of the last commit is gone: it may be that store renamed;
- a store moved to another sub-topology: its tasks' ids change, and so does where its state
  is kept (state dir and changelog), so it would start empty;
- a store's kind or key/value serde changed: the new serdes would read the old bytes;
- a repartition topic is gone, or its serdes changed, while records of the last commit wait
  in a task's buffer (``repartition_buffered``): those records would be dropped or misread.

A new store when none is gone is a new operator: it starts empty, as it should, and is only
logged. A person accepts a refused change per store (docs/upgrades.md):
``platform.upgrade.allow.new.stores`` (may start empty), ``platform.upgrade.drop.stores``
(may be left behind; a repartition topic's buffered records may be dropped) and
``platform.upgrade.allow.serde.changes``. A commit log written before layouts were recorded
has none: the first start then checks nothing, and says so in a log line.

A serde is recorded by its ``name`` (``string``, ``long``, ``time-windowed(string, 60000)``:
a window's size is in it) or, for one without (a registry serde's name says only
``registry``), by its class's import path: a compatible schema change is not a serde change.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from streamplatform.config import ConfigError, StreamsConfig
from streamplatform.dsl.graph import SourceNode, topic_name
from streamplatform.dsl.naming import (
    STATE_STORE,
    changelog_topic,
    how_to_name,
    internal_resources,
    keeps_its_state_when_named_so,
)
from streamplatform.dsl.topology import Topology

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1
ALLOW_NEW = "platform.upgrade.allow.new.stores"
DROP = "platform.upgrade.drop.stores"
ALLOW_SERDE_CHANGES = "platform.upgrade.allow.serde.changes"
_INDEX = re.compile(r"-\d{10}(?=-|$)")  # a generated name's index
_GENERATED_STORE = re.compile(r"KSTREAM-[A-Z]+(?:-[A-Z]+)*-\d{10}(-|$)")


class UpgradeRefused(ConfigError):
    """The job's stores differ from its last commit's in a way that would start a store empty,
    leave one's state behind or read it with other serdes; the message names each store, its
    operator, and the ways on (name the operator, accept it per store, or reset)."""


def serde_identity(serde: Any) -> str | None:
    """What a serde is recorded as: its ``name``, else its class's import path."""
    if serde is None:
        return None
    name = getattr(serde, "name", None)
    if isinstance(name, str) and name and name != "registry":
        return name
    kind = type(serde)
    return f"{kind.__module__}.{kind.__qualname__}"


def store_layout(topology: Topology, application_id: str) -> dict[str, Any]:
    """The layout a commit records (plain JSON data)."""
    resources = internal_resources(topology, application_id)
    operators = {r.name: r.operator for r in resources if r.kind == STATE_STORE}
    subtopology = {store: s.id for s in topology.subtopologies for store in s.stores}
    stores = {}
    for name, spec in topology.stores.items():
        if getattr(spec, "global_topic", None) is not None:
            continue  # a global table's copy: rebuilt from its topic, nothing to keep
        key_serde, value_serde = topology.store_serdes.get(name, (None, None))
        stores[name] = {
            "kind": spec.kind,
            "key_serde": serde_identity(key_serde),
            "value_serde": serde_identity(value_serde),
            "changelog": changelog_topic(application_id, name),
            "subtopology": subtopology.get(name),
            "operator": operators[name],
        }
    repartition = {
        topic_name(node.topic, True, application_id): {
            "key_serde": serde_identity(node.key_serde),
            "value_serde": serde_identity(node.value_serde),
        }
        for node in topology.nodes.values()
        if isinstance(node, SourceNode) and node.internal
    }
    return {"version": LAYOUT_VERSION, "stores": stores, "repartition_topics": repartition}


def layout_json(topology: Topology, application_id: str) -> str:
    return json.dumps(store_layout(topology, application_id), sort_keys=True)


def check_upgrade(
    recorded: str | None,
    current_json: str,
    settings: StreamsConfig,
    last_batch: int,
    buffered: int = 0,
) -> None:
    """Compare the job's layout (``layout_json``) with the one the last commit (batch
    ``last_batch``) ``recorded`` (None: a commit from before layouts: nothing to compare);
    raise ``UpgradeRefused`` naming each change that is not accepted by the settings.
    ``buffered``: the repartitioned records the last commit left waiting in buffers."""
    app = settings["application.id"]
    if recorded is None:
        log.warning("%s: the last commit (batch %d) recorded no store layout (written before "
                    "layouts were): the stores are not compared with it this time; the next "
                    "commit records them", app, last_batch)  # fmt: skip
        return
    previous, current = json.loads(recorded), json.loads(current_json)
    problems = upgrade_problems(previous, current, settings, buffered)
    if problems:
        raise UpgradeRefused(
            f"{app}: the topology's stores do not match those of the last commit (batch "
            f"{last_batch}); starting would lose state silently, so the job does not start:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\nWays on (docs/upgrades.md): name the operators; accept the change per store "
            f"({ALLOW_NEW}, {DROP}, {ALLOW_SERDE_CHANGES}); or reset the application."
        )
    new = sorted(set(current["stores"]) - set(previous.get("stores", {})))
    if new:
        log.info("%s: new stores, starting empty: %s", app, ", ".join(new))


def upgrade_problems(
    previous: Mapping[str, Any], current: Mapping[str, Any], settings: StreamsConfig,
    buffered: int = 0,
) -> list[str]:  # fmt: skip
    """What in ``current`` would lose state against ``previous``, as sentences; the changes
    the settings accept are left out."""
    allow_new, drop = set(settings[ALLOW_NEW]), set(settings[DROP])
    allow_serdes = set(settings[ALLOW_SERDE_CHANGES])
    before, now = previous.get("stores", {}), current["stores"]
    gone, new = sorted(set(before) - set(now)), sorted(set(now) - set(before))
    problems = []
    renamed = _renames(gone, new)
    for old, fresh in renamed:
        if old not in drop or fresh not in allow_new:
            problems.append(_renamed(old, fresh, before[old]["operator"]))
    paired = {store for pair in renamed for store in pair}
    unpaired_new = [store for store in new if store not in paired]
    for store in gone:
        if store not in paired and store not in drop:
            problems.append(_gone(store, before[store]["operator"], unpaired_new))
    for store in sorted(set(before) & set(now)):
        problems += _changed(store, before[store], now[store], allow_new, allow_serdes)
    if buffered:
        problems += _buffered_topics(previous.get("repartition_topics", {}),
                                     current["repartition_topics"], buffered, drop,
                                     allow_serdes)  # fmt: skip
    return problems


def _serdes(recorded: Mapping[str, Any]) -> str:
    return f"(key {recorded.get('key_serde')}, value {recorded.get('value_serde')})"


def _buffered_topics(
    before: Mapping[str, Any], now: Mapping[str, Any], buffered: int, drop: set[str],
    allow_serdes: set[str],
) -> list[str]:  # fmt: skip
    """Repartition topics hold nothing between batches (a Spark shuffle within the batch),
    except the records a task could not take yet, kept in its buffer as written: a topic gone
    would drop them, other serdes would misread them."""
    problems = []
    waiting = f"while {buffered} repartitioned records of the last commit wait in task buffers"
    for topic in sorted(set(before) - set(now) - drop):
        problems.append(
            f"repartition topic {topic} is gone {waiting}: those of it would be dropped. Run "
            f"the old topology until it has read everything, or add the topic to {DROP}"
        )
    for topic in sorted(set(before) & set(now) - allow_serdes):
        if before[topic] != now[topic]:
            problems.append(
                f"repartition topic {topic} changed its serdes from {_serdes(before[topic])} "
                f"to {_serdes(now[topic])} {waiting}: those of it would be misread. Run the old "
                f"topology until it has read everything, or add the topic to {ALLOW_SERDE_CHANGES}"
            )
    return problems


def _renames(gone: Iterable[str], new: Iterable[str]) -> list[tuple[str, str]]:
    """Gone and new stores named after generated names of one kind and suffix (the index
    aside), paired in order: an operator added or removed upstream shifts the later indices
    alike."""
    new_by_shape: dict[str, list[str]] = {}
    for store in new:
        if _GENERATED_STORE.match(store):
            new_by_shape.setdefault(_INDEX.sub("-#", store), []).append(store)
    pairs = []
    for store in gone:
        candidates = new_by_shape.get(_INDEX.sub("-#", store))
        if _GENERATED_STORE.match(store) and candidates:
            pairs.append((store, candidates.pop(0)))
    return pairs


def _renamed(old: str, new: str, operator: str) -> str:
    how = how_to_name(operator)
    if keeps_its_state_when_named_so(operator):
        named = how.replace("name=...", f"name={operator!r}").replace("(...)", f"({operator!r})")
        keep = f"To keep its state, give the operator its old name: {named}"
    else:
        keep = f"Naming it now ({how}) cannot keep its state: reset the application, or accept"
    return (
        f"store {old} of the last commit is gone and {new} is new: an operator was added or "
        f"removed upstream of the unnamed stateful operator {operator}, which renamed its "
        f"store, so it would start empty. {keep}; or accept the loss: {DROP}={old} and "
        f"{ALLOW_NEW}={new}"
    )


def _gone(store: str, operator: str, new: list[str]) -> str:
    candidates = f" (new stores that may be it renamed, and would then start empty: " \
        f"{', '.join(new)})" if new else ""  # fmt: skip
    return (
        f"store {store} (operator {operator}) of the last commit is gone: its state would "
        f"be left behind{candidates}. If its operator was renamed, give it its old name "
        f"back; if it was removed on purpose, add the store to {DROP}"
    )


def _changed(
    store: str, before: Mapping[str, Any], now: Mapping[str, Any], allow_new: set[str],
    allow_serdes: set[str],
) -> list[str]:  # fmt: skip
    """A store of both layouts that moved to another sub-topology or changed its kind or
    serdes, unless accepted."""
    problems = []
    if before.get("subtopology") != now.get("subtopology") and store not in allow_new:
        problems.append(
            f"store {store} (operator {now['operator']}) moved from sub-topology "
            f"{before.get('subtopology')} to {now.get('subtopology')}: its tasks' ids change, "
            "and with them where its state is kept, so it would start empty. Keep the "
            "sub-topologies in their order (a new source or a new repartition after the "
            f"existing ones), or add it to {ALLOW_NEW}"
        )
    if store in allow_serdes:
        return problems
    for what in ("kind", "key_serde", "value_serde"):
        if before.get(what) != now.get(what):
            problems.append(
                f"store {store} (operator {now['operator']}): its {what.replace('_', ' ')} "
                f"changed from {before.get(what)} to {now.get(what)}: the new one would read "
                f"the bytes the old one wrote. Reset, or add the store to {ALLOW_SERDE_CHANGES} "
                "if it reads them"
            )
    return problems
