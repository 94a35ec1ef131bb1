"""`make demo`'s Kafka -> Spark -> Delta path, against the test run's broker and Spark."""

from __future__ import annotations

import pytest

from streamplatform import demo

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_demo_loads_every_record_once(spark, kafka_settings, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path))
    demo.run(count=300, bootstrap_servers=kafka_settings["bootstrap.servers"])

    out = capsys.readouterr().out
    table = tmp_path / "delta" / demo.TABLE
    assert f"Delta table: {table}" in out
    assert "Rows:        300" in out
    rows = spark.read.format("delta").load(str(table))
    assert rows.select("id").distinct().count() == 300
    assert rows.where("currency IS NULL").count() == 0  # every value parsed
