"""The pytest plugin end to end, in a throwaway project (pytester)."""

import pytest

pytest_plugins = ["pytester"]

SUBSET = "n8 and M1- and fp16"


def test_matrix_runs_against_a_correct_kernel(pytester: pytest.Pytester):
    result = pytester.runpytest_inprocess("--w4a16-kernel=fixtures.specs:blas_fp32", "-k", SUBSET, "-q")
    result.assert_outcomes(passed=8)


def test_buggy_kernel_fails_with_diagnosis_and_probe_report(pytester: pytest.Pytester):
    result = pytester.runpytest_inprocess("--w4a16-kernel=fixtures.specs:zero_point_off_by_one", "-k",
                                          SUBSET + " and asym", "-q")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*zero_point_off_by_one small.n8-K256xN8-G32-M1-fp16-asym*",
                                 "*diagnosis: *", "*probe rows*mismatching*"])


def test_hook_adds_cases(pytester: pytest.Pytester):
    pytester.makeconftest("""
        import torch
        from oracle.cases import Case
        from oracle.shapes import LinearShape

        def pytest_w4a16_cases(config, cases):
            cases.append(Case(LinearShape("mine", "extra", 64, 16), 2, torch.bfloat16, False, 32, True))
    """)
    result = pytester.runpytest_inprocess("--w4a16-kernel=fixtures.specs:blas_fp32", "-k", "mine", "-q")
    result.assert_outcomes(passed=1)


def test_fixture_checks_a_single_case(pytester: pytest.Pytester):
    pytester.makepyfile("""
        from fixtures.specs import blas_fp32, zero_point_off_by_one
        from oracle.cases import parity_cases

        def test_good(w4a16_check):
            assert w4a16_check(blas_fp32, parity_cases("cpu")[0]).passed

        def test_bad(w4a16_check):
            w4a16_check(zero_point_off_by_one, parity_cases("cpu")[0])
    """)
    result = pytester.runpytest_inprocess("-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*one-hot k=*"])


def test_no_kernel_option_adds_nothing(pytester: pytest.Pytester):
    pytester.makepyfile("def test_plain():\n    pass\n")
    pytester.runpytest_inprocess("-q").assert_outcomes(passed=1)
