"""The README's screenshots of the Dagster UI, taken after `make demo` (`make screenshots`).

Starts the Dagster UI on 127.0.0.1 with the demo's instance (``DAGSTER_HOME=.data/dagster``) in a
process group of its own, opens pages in headless Debian chromium over the DevTools protocol
(``webui.py``, as the UI test does), saves them as PNGs under ``docs/images/`` and
stops the whole group (and chromium's), also on errors or Ctrl-C.

The UI is the webserver of `dagster dev` without its daemon (``--daemon`` adds it): with the
demo's broker stopped, a schedule tick (the DLQ replay every 15 minutes) would add a failed run
to the demo's story while the pictures are taken.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from streamplatform import data_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # webui.py lives with the example, at the root of the checkout
import webui  # noqa: E402

IMAGES = ROOT / "docs" / "images"
WIDTH, HEIGHT = 1600, 1000
GROUPS = ("streaming", "operations")
ASSETS = ("transactions_deduplicated", "transactions_enrichment",
          "transactions_enrichment_fx_rates_versions", "transactions_enriched",
          "standby_placements")  # fmt: skip
RUNS = "{ runsOrError(limit: 100) { ... on Runs { results { runId } } } }"
EXPANDED = quote(",".join(f"global@global:{group}" for group in GROUPS))
# (file, path, what the page shows once rendered, what it is for)
PAGES = [
    # (the graph shortens long names: transactions_en…_rates_versions)
    ("asset-graph.png", f"/asset-groups?expanded={EXPANDED}",
     (*(a if len(a) < 32 else a[-15:] for a in ASSETS), "Materialized"),
     "the asset graph, every asset materialized by the demo"),
    ("asset-transactions_deduplicated.png", "/assets/transactions_deduplicated",
     ("transactions_deduplicated", "duplicates_dropped", "dlq_records"),
     "an asset's latest materialization and its metadata"),
    ("asset-transactions_enriched.png",
     "/assets/transactions_enriched?view=partitions&partition=2026-01-01",
     ("transactions_enriched", "2026-01-01", "batch_as_of"),
     "the daily partition the sensor's backfill recomputed"),
    ("runs.png", "/runs", ("enriched_backfill", "late_backfill", "dlq_replay"),
     "the demo's runs: the sensor's backfill on top"),
]  # fmt: skip
# Before the first page: no "join the community" dialog, the graph top-down.
STORAGE = {"communityNux": '"1"', "asset-graph-direction": '"vertical"'}
CLICK = """(() => {{ const b = Array.from(document.querySelectorAll('button')).find({});
  if (b) {{ b.click(); }} return !!b; }})()"""
HIDE_NAVIGATION = CLICK.format("b => b.innerText.trim() === 'Hide navigation'")
HIDE_GRAPH_SIDEBAR = CLICK.format("b => b.querySelector('[aria-label=panel_show_right]')")


def settle(browser: webui.Browser, wanted: tuple[str, ...], what: str, log: Path) -> None:
    """Wait until the page shows ``wanted``, then until its DOM stops changing."""
    seen = {"text": ""}

    def rendered() -> bool:
        seen["text"] = browser.text()
        return all(w in seen["text"] for w in wanted)

    try:
        webui.wait_for(f"{what} to show {wanted}", rendered, 120, log)
    except TimeoutError:
        print(f"The page showed:\n{seen['text'][:3000]}", file=sys.stderr)
        raise
    previous, stable = None, 0
    deadline = time.monotonic() + 20
    while stable < 3 and time.monotonic() < deadline:
        time.sleep(1)
        current = browser.evaluate("document.body.innerHTML.length")
        stable = stable + 1 if current == previous else 0
        previous = current


def double_click(browser: webui.Browser, x: int, y: int) -> None:
    """A real double click (the asset graph zooms to fit on one on its background)."""
    for count in (1, 2):
        for kind in ("mousePressed", "mouseReleased"):
            browser.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                         clickCount=count)  # fmt: skip


def take(base: str, browser: webui.Browser, log: Path) -> list[Path]:
    browser.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                 deviceScaleFactor=1, mobile=False)  # fmt: skip
    browser.call("Page.navigate", url=f"{base}/runs")
    webui.wait_for("the UI", lambda: "Runs" in browser.text(), 120, log)
    for key, value in STORAGE.items():
        browser.evaluate(f"localStorage.setItem({key!r}, {value!r})")
    shots = []
    for index, (name, path, wanted, what) in enumerate(PAGES):
        browser.call("Page.navigate", url=f"{base}{path}")
        if index == 0:  # the graph: make room, then zoom it to fit
            settle(browser, (*GROUPS, "transactions_enrichment"), what, log)
            browser.evaluate(HIDE_NAVIGATION)  # remembered for the next pages
            browser.evaluate(HIDE_GRAPH_SIDEBAR)
            time.sleep(1)
            double_click(browser, WIDTH - 100, 250)
        settle(browser, wanted, what, log)
        shots.append(browser.screenshot(IMAGES / name))
        print(f"{IMAGES / name}: {what}", flush=True)
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--daemon", action="store_true", help="`dagster dev` with its daemon")
    args = parser.parse_args(argv)
    home = data_dir() / "dagster"
    if not (home / "history").is_dir():
        raise SystemExit(f"No Dagster instance with runs in {home}: run `make demo` first.")
    env = os.environ | {"DAGSTER_HOME": str(home)}
    with tempfile.TemporaryDirectory(prefix="streamplatform-screenshots-") as scratch:
        work = Path(scratch)
        log = work / "dagster.log"
        print(f"Starting the Dagster UI (DAGSTER_HOME={home}) and headless chromium ...")
        with (
            webui.dagster_dev(ROOT, env, log, daemon=args.daemon) as (_, base),
            webui.chromium(work, window=f"{WIDTH},{HEIGHT}") as browser,
        ):
            graphql = webui.GraphQL(f"{base}/graphql")
            runs = len(graphql(RUNS)["runsOrError"]["results"])
            print(f"{base}: {runs} runs in the instance", flush=True)
            take(base, browser, log)
            added = len(graphql(RUNS)["runsOrError"]["results"]) - runs
            if added:
                print(f"note: {added} run(s) were launched while the pictures were taken")
    print("Stopped the Dagster UI and chromium.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
