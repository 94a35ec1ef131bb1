"""The marker files that an unfinished operation on a job leaves in its Delta root (beside its
tables): a job refuses to start while one is there, and so does the other operation."""

RESET_UNFINISHED = "_reset_unfinished.json"  # streamplatform reset (reset.py)
REWIND_UNFINISHED = "_rewind_unfinished.json"  # streamplatform rewind (rewind.py)
