"""tools/fit_policy.py's hybrid fit on cells built in memory: which cells it trusts and which path
it weighs the skinny op against."""

import pytest

from optimized import policy
from oracle.report import Row
from tools.fit_policy import by_provider, fit_hybrid

CURRENT = policy.HybridThresholds(skinny_max_m=16, transient_min_m=4096, dense_min_m=4096)


def row(shape: str, m: int, provider: str, us: float, golden: str | None = None) -> Row:
    return Row("matmul", shape, m, "bf16", "asym", provider, us, None, None, None, None, golden, None)


def table(times: dict[str, dict[int, float]], shape: str = "a") -> list[Row]:
    return [row(shape, m, provider, us) for provider, by_m in times.items() for m, us in by_m.items()]


def test_a_cell_slower_than_its_golden_band_is_left_out():
    rows = [row("a", 512, "transient", 10.0, golden="slower"), row("a", 512, "triton", 20.0, golden="faster"),
            row("b", 512, "transient", 11.0, golden="within")]
    cells, left_out = by_provider(rows)
    assert set(cells["transient"]) == {("b", "bf16", "asym", 512)} and ("a", "bf16", "asym", 512) in cells["triton"]
    assert left_out == ["a M=512 transient"]


@pytest.mark.parametrize("case, transient_512, skinny_max_m", [
    ("transient-slower-skinny-keeps-512", 12.0, 512),   # skinny (10) beats the transient path (12) at 512
    ("transient-faster-skinny-stops-at-64", 8.0, 64),  # from 512 on the transient path is the rival: 8 < 10
])
def test_skinny_stops_where_the_path_that_runs_without_it_is_faster(case, transient_512, skinny_max_m):
    rows = table({"skinny": {64: 5.0, 512: 10.0}, "triton": {64: 8.0, 512: 20.0},
                  "transient": {64: 30.0, 512: transient_512}})
    fitted = fit_hybrid(by_provider(rows)[0], CURRENT, "a card")
    # The transient path beats Triton at 512 in both cases, so it takes over from there.
    assert fitted["transient_min_m"] == 512
    assert fitted["skinny_max_m"] == skinny_max_m, fitted["summary"]
