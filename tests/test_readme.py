"""The README's examples run as written: its example kernel passes, and the hybrid op's result passes."""

import re
from pathlib import Path


def run_example(section: str, index: int = 0) -> None:
    text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", body, re.S)[index]
    exec(compile(code, "README.md", "exec"), {})


def test_check_your_kernel_example_runs(capsys):
    run_example("Check your kernel")
    passed, _, total = capsys.readouterr().out.split()[:3]
    assert passed == total and int(total) > 100


def test_use_our_kernel_example_runs(capsys):
    run_example("Use our kernel")
    impl, passed = capsys.readouterr().out.split()[:2]
    assert impl in ("dense", "skinny", "triton", "torch") and passed == "True"


def test_read_checkpoint_example_runs(capsys):
    run_example("Check your kernel", 1)
    assert capsys.readouterr().out.strip() == "{'model.layers.0.mlp.down_proj': (64, 256, 128, False)}"


def test_model_example_runs(capsys):
    run_example("Use our kernel", 1)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("14 Linear layer(s) now W4A16Linear") and "0 unmatched" in out[0]
    assert out[-1] == "torch.Size([1, 3, 512])"
