"""The README's Python examples run as written: every ```python block is executed (blocks
that need a running broker are fenced as ```py and covered by the runtime tests instead)."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_python_examples_run(capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "the README has a Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Sub-topology: 0" in out
    assert "[('acct-1', {'id': 1, 'amount': 3, 'eur': 2.7})]" in out
