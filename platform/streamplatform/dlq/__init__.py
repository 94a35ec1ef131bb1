"""Dead letter queues (KIP-1034): inspect them and replay them through the current topology.

- :mod:`~streamplatform.dlq.records`: :class:`DlqRecord` — a DLQ record decoded, with its
  ``__streams.errors.*`` headers as :class:`ErrorInfo` and its source coordinates;
- :mod:`~streamplatform.dlq.inspect`: read the runtime's Delta mirror or the DLQ topic,
  :func:`summarize` them;
- :mod:`~streamplatform.dlq.preflight`: does a record still fail with the current topology?
- :mod:`~streamplatform.dlq.replay`: :class:`DlqReplayer` re-publishes what passes to its source
  topic and parks what fails again, each DLQ record exactly once (see the module docstring);
- :mod:`~streamplatform.dlq.ledger`: the replay's Delta tables (log, replayed, parked).
"""

from streamplatform.dlq.inspect import (
    DlqSummary,
    mirror_path,
    mirror_records,
    read_mirror,
    read_topic,
    summarize,
)
from streamplatform.dlq.preflight import Verdict, preflight
from streamplatform.dlq.records import DlqRecord, ErrorInfo, SourceCoordinates
from streamplatform.dlq.replay import DlqReplayer, ReplayReport

__all__ = [
    "DlqRecord",
    "DlqReplayer",
    "DlqSummary",
    "ErrorInfo",
    "ReplayReport",
    "SourceCoordinates",
    "Verdict",
    "mirror_path",
    "mirror_records",
    "preflight",
    "read_mirror",
    "read_topic",
    "summarize",
]
