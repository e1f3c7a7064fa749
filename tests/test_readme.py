"""The README's examples run as written: its example kernel passes, and the hybrid op's result passes."""

import re
from pathlib import Path


def run_example(section: str) -> None:
    text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text.split(f"## {section}", 1)[1], re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})


def test_check_your_kernel_example_runs(capsys):
    run_example("Check your kernel")
    passed, _, total = capsys.readouterr().out.split()[:3]
    assert passed == total and int(total) > 100


def test_use_our_kernel_example_runs(capsys):
    run_example("Use our kernel")
    impl, passed = capsys.readouterr().out.split()[:2]
    assert impl in ("dense", "skinny", "triton", "torch") and passed == "True"
