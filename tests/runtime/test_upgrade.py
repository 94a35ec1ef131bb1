"""The store layout a commit records, and the start that refuses an upgrade that would start
a store empty, orphan one or read it with other serdes (pure logic, and the commit log's
column through delta-rs: no Spark, no broker)."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pytest

from streamplatform import StreamsBuilder, StreamsConfig, TimeWindows
from streamplatform.runtime import delta_direct
from streamplatform.runtime.logs import CommitLog
from streamplatform.runtime.upgrade import UpgradeRefused, check_upgrade, layout_json
from streamplatform.serdes import Serdes

APP = "app"


def views_count(*, filtered=False, name=None, value_serde=None, window_ms=None):
    """Views per user: ``filtered`` adds a filter upstream of the count."""
    b = StreamsBuilder()
    views = b.stream("views", Serdes.string(), Serdes.json())
    if filtered:
        views = views.filter(lambda k, v: True)
    grouped = views.group_by_key()
    if window_ms is not None:
        grouped = grouped.windowed_by(TimeWindows.of_size_and_grace(window_ms, 0))
    if value_serde is None:
        table = grouped.count(name=name)
    else:
        table = grouped.aggregate(lambda: 0, lambda k, v, n: n + 1, value_serde, name=name)
    table.to_stream().to("counts")
    return b.build()


def start(before, after, buffered=0, **settings):
    """Start ``after`` over a last commit (batch 7) that recorded ``before``'s layout."""
    config = StreamsConfig({"application.id": APP} | settings)
    check_upgrade(layout_json(before, APP), layout_json(after, APP), config, 7, buffered)


def test_an_operator_added_upstream_of_an_unnamed_count_is_refused_naming_both_stores():
    with pytest.raises(UpgradeRefused) as refused:
        start(views_count(), views_count(filtered=True))
    message = str(refused.value)
    assert "batch 7" in message
    assert ("store KSTREAM-COUNT-0000000001-STATE-STORE of the last commit is gone and "
            "KSTREAM-COUNT-0000000002-STATE-STORE is new") in message  # fmt: skip
    assert "upstream of the unnamed stateful operator KSTREAM-COUNT-0000000001" in message
    # The ways on: its old name back, or the loss accepted store by store.
    assert "count(name='KSTREAM-COUNT-0000000001')" in message
    assert ("platform.upgrade.drop.stores=KSTREAM-COUNT-0000000001-STATE-STORE and "
            "platform.upgrade.allow.new.stores=KSTREAM-COUNT-0000000002-STATE-STORE") in message  # fmt: skip


def test_the_same_upgrade_of_a_named_count_starts():
    start(views_count(name="views"), views_count(filtered=True, name="views"))


def test_giving_the_unnamed_operator_its_old_name_keeps_its_store():
    """What the refusal advises does what it says: the upgraded job's layout then matches."""
    start(views_count(), views_count(filtered=True, name="KSTREAM-COUNT-0000000001"))


def test_the_loss_is_accepted_only_with_both_stores_listed():
    drop = {"platform.upgrade.drop.stores": "KSTREAM-COUNT-0000000001-STATE-STORE"}
    allow = {"platform.upgrade.allow.new.stores": ["KSTREAM-COUNT-0000000002-STATE-STORE"]}
    for one in (drop, allow):
        with pytest.raises(UpgradeRefused):
            start(views_count(), views_count(filtered=True), **one)
    start(views_count(), views_count(filtered=True), **drop, **allow)


def test_a_removed_stateful_operator_is_refused_unless_its_store_is_dropped():
    b = StreamsBuilder()
    b.stream("views", Serdes.string(), Serdes.json()).to("counts")
    stateless = b.build()
    with pytest.raises(UpgradeRefused, match="store views-STATE-STORE .* is gone: its state "
                                             "would be left behind"):  # fmt: skip
        start(views_count(name="views"), stateless)
    start(views_count(name="views"), stateless,
          **{"platform.upgrade.drop.stores": "views-STATE-STORE"})  # fmt: skip


def test_a_new_stateful_operator_alone_starts_its_store_empty_without_a_refusal(caplog):
    b = StreamsBuilder()
    b.stream("views", Serdes.string(), Serdes.json()).to("counts")
    with caplog.at_level(logging.INFO, logger="streamplatform.runtime.upgrade"):
        start(b.build(), views_count(name="views"))
    assert "new stores, starting empty: views-STATE-STORE" in caplog.text


def test_a_store_moved_to_another_sub_topology_is_refused():
    """A new source defined first takes sub-topology 0: the count's tasks become 1_*, whose
    state is elsewhere."""
    b = StreamsBuilder()
    b.stream("clicks", Serdes.string(), Serdes.json()).to("clicks-out")
    b.stream("views", Serdes.string(), Serdes.json()).group_by_key().count(
        name="views"
    ).to_stream().to("counts")
    moved = b.build()
    with pytest.raises(UpgradeRefused, match="views-STATE-STORE .* moved from sub-topology 0 to 1"):
        start(views_count(name="views"), moved)
    start(views_count(name="views"), moved,
          **{"platform.upgrade.allow.new.stores": "views-STATE-STORE"})  # fmt: skip


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (views_count(name="n", value_serde=Serdes.long()),
         views_count(name="n", value_serde=Serdes.json()), "value serde changed from long to json"),
        (views_count(name="n", window_ms=10_000), views_count(name="n", window_ms=20_000),
         "key serde changed from time-windowed(string, 10000) to time-windowed(string, 20000)"),
    ],
    ids=["value-serde", "window-size"],
)  # fmt: skip
def test_a_store_read_with_other_serdes_is_refused_unless_allowed(before, after, changed):
    with pytest.raises(UpgradeRefused, match=changed.replace("(", r"\(").replace(")", r"\)")):
        start(before, after)
    start(before, after, **{"platform.upgrade.allow.serde.changes": "n-STATE-STORE"})


def test_a_repartition_topic_gone_or_reserialized_is_refused_only_while_records_wait_in_it():
    def regrouped(name, value_serde=None):
        """Re-keyed through a repartition topic named ``name``; the count keeps its store."""
        b = StreamsBuilder()
        b.stream("views", Serdes.string(), value_serde or Serdes.json()).select_key(
            lambda k, v: v["page"]
        ).repartition(name=name).group_by_key().count(name="per-page").to_stream().to("counts")
        return b.build()

    before, renamed, reserialized = regrouped("a"), regrouped("b"), regrouped("a", Serdes.bytes())
    start(before, renamed, buffered=0)  # nothing waits in app-a-repartition: nothing is lost
    start(before, reserialized, buffered=0)
    with pytest.raises(UpgradeRefused, match="repartition topic app-a-repartition is gone"):
        start(before, renamed, buffered=3)
    changed = r"app-a-repartition changed its serdes from \(key string, value json\) to \(key"
    with pytest.raises(UpgradeRefused, match=changed):
        start(before, reserialized, buffered=3)
    start(before, renamed, buffered=3, **{"platform.upgrade.drop.stores": "app-a-repartition"})
    start(before, reserialized, buffered=3,
          **{"platform.upgrade.allow.serde.changes": "app-a-repartition"})  # fmt: skip


def test_a_commit_from_before_layouts_is_not_compared_and_the_job_says_so(caplog):
    config = StreamsConfig({"application.id": APP})
    with caplog.at_level(logging.INFO, logger="streamplatform.runtime.upgrade"):
        check_upgrade(None, layout_json(views_count(filtered=True), APP), config, 7)
    assert "the last commit (batch 7) recorded no store layout" in caplog.text


def test_the_layout_names_each_store_its_serdes_changelog_and_the_repartition_topics():
    b = StreamsBuilder()
    b.stream("views", Serdes.string(), Serdes.json()).group_by(
        lambda k, v: v["page"], Serdes.string()
    ).count().to_stream().to("counts")
    layout = json.loads(layout_json(b.build(), APP))
    assert layout == {
        "version": 1,
        "stores": {"KSTREAM-COUNT-0000000002-STATE-STORE": {
            "kind": "key_value", "key_serde": "string", "value_serde": "long",
            "changelog": "app-KSTREAM-COUNT-0000000002-STATE-STORE-changelog",
            "subtopology": 1, "operator": "KSTREAM-COUNT-0000000002",
        }},
        "repartition_topics": {"app-KSTREAM-COUNT-0000000002-repartition": {
            "key_serde": "string", "value_serde": "json",
        }},
    }  # fmt: skip


def test_the_commit_log_keeps_the_layout_and_older_rows_read_none(tmp_path):
    path = str(tmp_path / "_commits")
    old = pa.table({"batch_id": [0], "consumed": ["[]"], "metrics": ["{}"]})
    delta_direct.append(path, old, "app-commits", 0)  # a commit log from before the column
    commits = CommitLog(path, APP)
    assert commits.last().layout is None
    layout = layout_json(views_count(name="views"), APP)
    commits.append(1, {("views", 0): 3}, {}, "exactly_once_v2", layout)
    assert commits.last().layout == layout
