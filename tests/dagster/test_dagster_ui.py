"""The UI end to end: `dagster dev` serves the code location, a materialization launched through
the GraphQL API succeeds, and headless Debian chromium renders the asset's page with the asset
names and the run's metadata; a continuous job's report, sent without a run, shows on its
asset's page as the latest materialization.

`dagster dev` runs in a process group of its own (it leaves children behind on SIGTERM
otherwise) and the whole group is stopped at the end, also when the test fails; so is chromium.
The run materializes ``standby_placements``: a real run (its own process, its own SparkSession,
a Delta table under a temporary ``STREAMPLATFORM_DATA``) that needs no topic. Slow: ~1 minute.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest
from dagster_support import LAUNCH

import demo
import webui
from webui import GraphQL, live_members, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ASSET = "standby_placements"
STATUS = """
query Status($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run { status } } }"""
METADATA = """
query Meta($path: [String!]!) { assetOrError(assetKey: {path: $path}) { ... on Asset {
  assetMaterializations(limit: 1) { runId metadataEntries { label
    ... on IntMetadataEntry { intValue } ... on PathMetadataEntry { path } } } } } }"""


@pytest.fixture
def chromium(tmp_path) -> Iterator[webui.Browser]:
    if not webui.CHROMIUM.exists():
        reason = (
            f"{webui.CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)"
        )
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    with webui.chromium(tmp_path) as browser:
        yield browser


@pytest.mark.dagster_dev
@pytest.mark.browser
def test_ui_materializes_through_graphql_and_renders_the_asset(chromium, kafka_settings, tmp_path):
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    demo.write_instance_config(home)  # the project's dagster.yaml (telemetry off, pools)
    env = os.environ | {
        "DAGSTER_HOME": str(home),
        "STREAMPLATFORM_DATA": str(data),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings["bootstrap.servers"],
        "SPARK_MASTER": "local[1]",
    }
    log = tmp_path / "dagster-dev.log"
    with webui.dagster_dev(ROOT, env, log) as (dagster_dev, base):
        graphql = GraphQL(f"{base}/graphql")
        params = {"selector": {"repositoryLocationName": "streamplatform",
                               "repositoryName": "__repository__", "jobName": "__ASSET_JOB",
                               "assetSelection": [{"path": [ASSET]}]}}  # fmt: skip
        launched = graphql(LAUNCH, params=params)["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        def finished() -> str | None:
            status = graphql(STATUS, runId=run_id)["runOrError"]["status"]
            return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

        assert wait_for(f"run {run_id}", finished, 240, log) == "SUCCESS"
        # The run's own process started a SparkSession and the Spark resource stopped it.
        wait_for("the Spark resource's teardown", lambda: "Stopped the SparkSession this run "
                 "started." in log.read_text(errors="replace"), 30, log)  # fmt: skip
        [event] = graphql(METADATA, path=[ASSET])["assetOrError"]["assetMaterializations"]
        assert event["runId"] == run_id
        metadata = {e["label"]: e.get("intValue", e.get("path")) for e in event["metadataEntries"]}
        assert metadata["generation"] == 1 and metadata["tasks"] == 6
        assert str(metadata["placements_table"]).startswith(str(data))

        chromium.call("Page.navigate", url=f"{base}/assets/{ASSET}")
        table = str(metadata["placements_table"])
        wanted = [ASSET, "Latest materialization", "placements_table", "level_absolute", table]

        seen = {"text": ""}

        def rendered() -> str | None:
            seen["text"] = text = chromium.text()
            return text if all(w in text for w in wanted) else None

        try:
            wait_for(f"the asset page to show {wanted}", rendered, 90, log)
        except TimeoutError:
            print(f"The asset page showed:\n{seen['text'][:5000]}")
            raise
        chromium.call("Page.navigate", url=f"{base}/runs/{run_id}")
        on_run_page = [run_id[:8], ASSET, "Materialized value standby_placements"]
        wait_for(f"the run page to show {on_run_page}",
                 lambda: all(w in chromium.text() for w in on_run_page), 90, log)  # fmt: skip
        shows_a_continuous_jobs_report(chromium, graphql, home, base, log)
        chromium.call("Page.navigate", url=f"{base}/assets")
        names = ("transactions_deduplicated", "transactions_enrichment",
                 "transactions_enrichment_fx_rates_versions", "transactions_enriched",
                 ASSET)  # fmt: skip
        seen["text"] = ""

        def catalog() -> bool:
            seen["text"] = chromium.text()
            return all(name in seen["text"] for name in names)

        try:
            wait_for(f"the asset catalog to list {names}", catalog, 90, log)
        except TimeoutError:
            print(f"The catalog showed:\n{seen['text'][:5000]}")
            raise
        chromium.screenshot(tmp_path / "asset-catalog.png")
        assert (tmp_path / "asset-catalog.png").stat().st_size > 10_000
    assert dagster_dev.poll() is not None
    assert live_members(dagster_dev.pid) == [], "dagster dev's group outlived the test"
    shutil.rmtree(home, ignore_errors=True)


def shows_a_continuous_jobs_report(chromium, graphql, home: Path, base: str, log: Path) -> None:
    """A `streamplatform run` job's report (ContinuousJobReporter, as `--dagster-asset` sends
    it) reaches the instance `dagster dev` serves, without a run, and the asset's page shows it
    as its latest materialization, next to the materialized assets. The job here is a stand-in
    with what the reporter reads of a StreamingJob: the UI is the subject."""
    from streamplatform import BatchResult
    from streamplatform.dagster import ContinuousJobReporter

    asset = "transactions_deduplicated"  # an asset of the code location, never materialized here
    job = SimpleNamespace(
        config={"application.id": "orders-continuous", "processing.guarantee": "exactly_once_v2"},
        delta_sinks=[], root=str(home / "delta"),
        commit_log=SimpleNamespace(last=lambda: None),
        claim=SimpleNamespace(run="ui-test", epoch=3),
    )  # fmt: skip
    batch = BatchResult(batch_id=41, records_in=120, records_out=96, dlq_records=0,
                        duplicates_dropped=24, restored_records=0, lag=0, duration_ms=250,
                        replayed=False, guarantee="exactly_once_v2", path="direct-spark")  # fmt: skip
    with dg.DagsterInstance.from_config(str(home)) as instance:
        reporter = ContinuousJobReporter(job, asset, every_batches=1, every_seconds=None,
                                         instance=instance)  # fmt: skip
        with reporter:
            reporter.on_batch(batch)
    [event] = graphql(METADATA, path=[asset])["assetOrError"]["assetMaterializations"]
    assert event["runId"] == ""  # reported, not materialized by a run
    chromium.call("Page.navigate", url=f"{base}/assets/{asset}")
    wanted = [asset, "committed_batch_id", "application_id", "orders-continuous", "job_state"]
    wait_for(f"the asset page to show the report {wanted}",
             lambda: all(w in chromium.text() for w in wanted), 90, log)  # fmt: skip
    chromium.screenshot(home.parent / "continuous-report.png")
