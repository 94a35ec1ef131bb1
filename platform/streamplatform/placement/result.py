"""What a placement run returns: the copies of every task, the level each task reached, the load.

The level of a task is judged on the outcome, not on the path the assignor took, so it can be
checked by anyone holding the plan and the instances' tags:

- ``absolute``: on every awareness key, the task's copies (active and standbys) all have
  different values — losing any one zone, cluster, ... loses at most one copy.
- ``partial``: not absolute, but on at least one awareness key all copies differ.
- ``least_preferred``: no awareness key keeps the copies apart.
- ``unplaced``: fewer standbys than ``num.standby.replicas`` were placed (too few instances, or
  strict mode refused the rest).

With no standbys requested, or no awareness keys, a task that misses no standby is trivially
``absolute``. Only stateful tasks have a level.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Level = Literal["absolute", "partial", "least_preferred", "unplaced"]
LEVELS: tuple[Level, ...] = ("absolute", "partial", "least_preferred", "unplaced")


def achieved_level(copy_tags: Sequence[Sequence[object]], missing: int) -> Level:
    """The level of one task from its copies' awareness tag values (one row per copy, one column
    per awareness key, in any consistent encoding) and the number of standbys it is missing."""
    if missing > 0:
        return "unplaced"
    copies = len(copy_tags)
    keys = len(copy_tags[0]) if copy_tags else 0
    apart = sum(len({row[k] for row in copy_tags}) == copies for k in range(keys))
    if apart == keys:
        return "absolute"
    return "partial" if apart else "least_preferred"


@dataclass(frozen=True)
class Placement:
    """A plan: ``active {task: client}``, ``standbys {task: [clients]}`` (every task of
    ``active``, in task order, standbys in the order they were chosen; empty for stateless
    tasks), ``levels {task: Level}`` (stateful tasks only), ``capacity {client: int}`` and
    ``load {client: (active + standby tasks) / capacity}`` for every instance."""

    active: Mapping[str, str]
    standbys: Mapping[str, list[str]]
    levels: Mapping[str, Level]
    capacity: Mapping[str, int]
    load: Mapping[str, float]

    def active_counts(self) -> dict[str, int]:
        """Active tasks per instance, every instance listed."""
        counts = Counter(self.active.values())
        return {client: counts[client] for client in self.capacity}

    def standby_counts(self) -> dict[str, int]:
        """Standby tasks per instance, every instance listed."""
        counts = Counter(client for clients in self.standbys.values() for client in clients)
        return {client: counts[client] for client in self.capacity}

    def standby_spread(self) -> int:
        """Balance of the standbys: max - min standby tasks per instance (0 = perfectly even)."""
        counts = self.standby_counts().values()
        return max(counts) - min(counts) if counts else 0

    def level_counts(self) -> dict[Level, int]:
        """How many stateful tasks reached each level, every level listed."""
        counts = Counter(self.levels.values())
        return {level: counts[level] for level in LEVELS}
