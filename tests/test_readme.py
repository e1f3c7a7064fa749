"""The README's "Check your kernel" example runs as written and its kernel passes."""

import re
from pathlib import Path


def test_check_your_kernel_example_runs(capsys):
    text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    section = text.split("## Check your kernel", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    passed, _, total = capsys.readouterr().out.split()[:3]
    assert passed == total and int(total) > 100
