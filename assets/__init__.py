"""The example's own assets and checks, beside what ``streamplatform.dagster`` declares.

- ``enriched``: ``transactions_enriched`` (daily partitions: the streaming join's rows of a day,
  or a batch as-of join for backfills), its ``enriched_backfill`` job and the
  ``stream_equals_batch_join`` check;
- ``checks``: ``no_duplicates_within_interval`` on the dedup job's asset (KIP-655's rule over
  the input, from ``dedup_audit``);
- ``placements``: ``standby_placements`` (KIP-708).

Each is built for the jobs ``definitions.py`` declares, so names and topics follow its
configuration.
"""

from assets.checks import no_duplicates_check
from assets.enriched import BACKFILL_JOB, DAILY, enriched_definitions
from assets.placements import placements_asset

__all__ = [
    "BACKFILL_JOB",
    "DAILY",
    "enriched_definitions",
    "no_duplicates_check",
    "placements_asset",
]
