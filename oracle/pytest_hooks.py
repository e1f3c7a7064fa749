"""Hook specifications of the w4a16 pytest plugin."""

import pytest


@pytest.hookspec
def pytest_w4a16_cases(config: pytest.Config, cases: list) -> None:
    """Append (or remove) `oracle.cases.Case` objects in `cases` before the matrix is collected.
    Called on every xdist worker, so the result must be deterministic."""
