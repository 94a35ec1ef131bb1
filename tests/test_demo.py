"""`make demo`: both mission jobs end to end against the test run's broker and Spark."""

from __future__ import annotations

import pytest

from streamplatform import demo

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_demo_runs_both_jobs_exactly_once(spark, kafka_settings, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    numbers = demo.run(count=400, bootstrap_servers=kafka_settings["bootstrap.servers"])

    data = numbers["data"]
    assert data.duplicates > 0 and data.poison >= 0 and data.late_corrections > 0
    dedup = numbers["dedup"]
    assert sum(r.records_in for r in dedup) == data.transactions + data.duplicates + data.poison
    assert sum(r.duplicates_dropped for r in dedup) == data.duplicates
    assert numbers["dlq_rows"] == data.poison == sum(r.dlq_records for r in dedup)
    # Every unique transaction met the FX rate valid at its time (rates start a day earlier).
    assert numbers["enriched_rows"] == data.transactions
    rows = spark.read.format("delta").load(str(numbers["enriched_path"]))
    assert rows.select("source_partition", "source_offset").distinct().count() == data.transactions
    out = capsys.readouterr().out
    assert "demo-dedup" in out and "demo-enrich" in out
    assert f"{data.transactions} enriched transactions" in out
