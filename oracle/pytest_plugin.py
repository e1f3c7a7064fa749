"""pytest plugin: `pytest --w4a16-kernel=package.module:spec` runs the parity matrix against a kernel.

One option group (`--w4a16-*`), one fixture (`w4a16_check`, for writing your own cases), and one
hook (`pytest_w4a16_cases`, in `oracle.pytest_hooks`) to add cases. Every case is its own test
item with a readable id (`kernel::shape-G-M-dtype-sym`), so it works with `-n auto` and `-k`.

pytest loads this module in every run of an environment where the package is installed, so it
imports torch and the oracle only when its options or its fixture are used.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from . import pytest_hooks
from .tiers import TIERS


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("w4a16", "W4A16 kernel parity (oracle)")
    group.addoption("--w4a16-kernel", action="append", default=[], metavar="package.module:spec",
                    help="a KernelSpec to run the parity matrix against (repeatable)")
    group.addoption("--w4a16-tier", choices=TIERS, default="cpu", help="case matrix size (default: cpu)")
    group.addoption("--w4a16-device", default=None,
                    help="cpu or cuda (default: on a GPU machine, xdist worker gwI on GPU I mod the visible GPUs)")
    group.addoption("--w4a16-seed", type=int, default=0, help="seed of the random inputs")
    group.addoption("--w4a16-shard", default=None, metavar="i/n",
                    help="only share i of n of the cases (whole weight groups; the n shares cover the tier)")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(pytest_hooks)


def _device(config: pytest.Config) -> str:
    chosen = config.getoption("w4a16_device")
    if chosen:
        return chosen
    import torch

    from .runner import worker_device

    return worker_device(os.environ.get("PYTEST_XDIST_WORKER"), torch.cuda.device_count())


class W4A16CaseItem(pytest.Item):
    def __init__(self, *, spec, case, probes: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec, self.case, self.probes = spec, case, probes
        self.report = None

    def runtest(self) -> None:
        from .check import check_case

        config = self.config
        self.report = check_case(self.spec, self.case, config.getoption("w4a16_seed"), _device(config), self.probes)
        if not self.report.passed:
            raise W4A16Failure(self.report)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, W4A16Failure):
            return describe_failure(excinfo.value.report)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.spec.name}::{self.case.id}"


class W4A16Failure(Exception):
    def __init__(self, report) -> None:
        super().__init__(report.case_id)
        self.report = report


def describe_failure(r) -> str:
    """The full account of a failed oracle.check.CaseReport."""
    lines = [f"{r.kernel} {r.case_id}"]
    if r.error:
        lines.append(r.error)
    if r.verdict is not None and not r.verdict.passed:
        lines.append(r.verdict.summary())
    if r.diagnosis:
        lines.append(f"diagnosis: {r.diagnosis}")
    if r.probe is not None and not r.probe.passed:
        lines.append(r.probe.summary())
    return "\n".join(lines)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    targets = config.getoption("w4a16_kernel")
    if not targets:
        return
    if _device(config) == "cpu":
        # Triton kernels reach the CPU only through the interpreter, chosen before they import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .cases import parity_cases
    from .check import probe_key
    from .cli import load_spec

    cases = parity_cases(config.getoption("w4a16_tier"))
    config.hook.pytest_w4a16_cases(config=config, cases=cases)
    if config.getoption("w4a16_shard"):
        from .runner import parse_shard, shard

        try:
            cases = shard(cases, *parse_shard(config.getoption("w4a16_shard")))
        except ValueError as e:
            raise pytest.UsageError(f"--w4a16-{e}") from None
    for target in targets:
        spec = load_spec(target)
        probed: set[tuple] = set()
        for case in cases:
            if not spec.supports(case)[0]:
                continue
            key = probe_key(case)
            items.append(W4A16CaseItem.from_parent(session, name=f"{spec.name}::{case.id}", spec=spec, case=case,
                                                   probes=key not in probed))
            probed.add(key)


@pytest.fixture
def w4a16_check(request: pytest.FixtureRequest) -> Callable:
    """check(spec, case, probes=True) -> oracle.check.CaseReport; fails the test with the full report
    on failure."""
    from .check import check_case

    device = _device(request.config)

    def check(spec, case, probes: bool = True):
        report = check_case(spec, case, request.config.getoption("w4a16_seed"), device, probes)
        if not report.passed:
            pytest.fail(describe_failure(report), pytrace=False)
        return report

    return check
