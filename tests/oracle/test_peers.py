"""The peer kernels shipped as specs (oracle/peers.py): judged on a GPU, filtered with a reason
where they cannot run."""

import importlib.util

import pytest
import torch

from oracle import check_kernel, parity_cases
from oracle.peers import gemlite, tinygemm

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="tinygemm and gemlite run on CUDA devices only")
needs_gemlite = pytest.mark.skipif(importlib.util.find_spec("gemlite") is None, reason="gemlite is not installed")


@pytest.mark.parametrize("spec", [tinygemm, gemlite], ids=lambda s: s.name)
def test_peers_say_why_they_cannot_run_here(spec):
    case = next(c for c in parity_cases("cpu") if c.dtype == torch.bfloat16 and c.k % 64 == 0 and c.group_size == 64)
    ok, reason = spec.supports(case)
    assert ok == (torch.cuda.is_available() and (spec is tinygemm or importlib.util.find_spec("gemlite") is not None))
    assert ok or reason


@needs_cuda
@pytest.mark.gpu
def test_tinygemm_passes_as_a_float_zero_kernel():
    cases = parity_cases("cpu", keep=lambda c: c.dtype == torch.bfloat16 and c.m in (1, 17))
    reports = check_kernel(tinygemm, cases, device="cuda")
    assert reports and all(r.passed for r in reports), [(r.case_id, r.diagnosis, r.error) for r in reports if not r.passed]


@needs_cuda
@needs_gemlite
@pytest.mark.gpu
def test_gemlite_is_judged_and_each_failure_explained():
    cases = parity_cases("cpu", keep=lambda c: c.m in (1, 3, 17) and c.group_size in (64, 128))
    reports = check_kernel(gemlite, cases, device="cuda")
    assert reports
    for r in reports:
        assert r.passed or r.diagnosis or r.error, r.case_id
