"""How many examples a property test draws.

``make test`` (the fast tier, ``STREAMPLATFORM_TEST_TIER=fast``) draws a third of the number a
test names, at least 10: it is the loop a change is tried in, and its property tests drew
~124 s of its ~12 min. ``make test-all``, and so CI, draws every example, with CI's fixed seed
(conftest.py): the counts the tests were checked against (each caught its mutations there).
Any other run of pytest draws every example too.
"""

from __future__ import annotations

import os

FAST_TIER = os.environ.get("STREAMPLATFORM_TEST_TIER") == "fast" and not os.environ.get("CI")


def examples(count: int) -> int:
    """``count``, or a third of it (at least 10) in the fast tier."""
    return max(10, count // 3) if FAST_TIER else count
