"""The end-to-end model benchmark's parts that run without a GPU: its static-cache Llama forward
against transformers' own, the whole command on a tiny config (--smoke), and its early failure
without transformers. The report's model section is tested in tests/oracle/test_report.py."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from oracle.cli import main as oracle_main

from . import model_e2e
from .static_llama import StaticLlama

HAS_GPU = torch.cuda.is_available()  # the smoke run uses the GPU where there is one


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread (under xdist more threads only contend for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers", reason="transformers is an optional dependency "
                                                      "(pip install 'w4a16-oracle[model]')")


@pytest.mark.parametrize("batch", (1, 3), ids=("B1", "B3"))
def test_static_forward_matches_the_models_own(transformers, batch):
    """Prefill then decode steps through the static cache give the logits the model's own forward
    gives for the whole sequence at those positions. In float64 both compute RMSNorm and the
    rotary table in float32 from the same inputs, so they agree to float64 rounding (2^-40 of the
    logits' size is far above it); a wrong position, cache slot, mask, rotary row or kv-head
    grouping moves logits by a large fraction of their size."""
    config = transformers.LlamaConfig(**{**model_e2e.TINY, "initializer_range": 0.125})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().eval()
    assert model.model.rotary_emb.rope_type == "llama3" and config.num_key_value_heads < config.num_attention_heads
    ids = torch.randint(0, config.vocab_size, (batch, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    engine = StaticLlama(model, batch, 16)
    got = [engine.prefill(ids[:, :6])]
    got += [engine.decode(ids[:, t:t + 1], torch.tensor([t])) for t in range(6, 9)]
    err = (torch.stack(got, 1) - want[:, 5:]).abs().max()
    assert err <= 2.0**-40 * want.abs().max(), f"max |static - model| = {err:.3g}"


def test_smoke_run_writes_rows_and_checks_that_the_report_renders(transformers, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["model_e2e"])
    rc = model_e2e.main(["--smoke", "--out", str(tmp_path), "--providers", "bf16,w4a16,tinygemm", "--batches", "1",
                         "--prefill", "8", "--steps", "1"])
    assert rc == 0
    data = json.loads((tmp_path / "model_e2e.json").read_text())
    rows = {(r["extra_info"]["provider"], r["extra_info"]["workload"], r["extra_info"]["m"]): r["extra_info"]
            for r in data["benchmarks"]}
    timed = ("bf16", "w4a16", "tinygemm") if HAS_GPU else ("bf16", "w4a16")
    assert set(rows) == {(p, w, m) for p in timed for w, m in (("decode", 1), ("prefill", 8))}
    assert all(r["kind"] == "model" and r["median_us"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    # The W4 step reads its packed weights: well under the bf16 model's bytes (lm_head stays bf16).
    assert rows[("w4a16", "decode", 1)]["weight_bytes"] < 0.7 * rows[("bf16", "decode", 1)]["weight_bytes"]
    assert set(rows[("w4a16", "decode", 1)]["hybrid_impl"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"}
    assert data["checks"]["w4a16"].startswith("PASS\nlayers: 14 of 14 within the oracle's bound")
    assert data["failed"] == []
    assert data["skipped"] == ({} if HAS_GPU else {"tinygemm": "aten._weight_int4pack_mm runs on CUDA only"})
    assert data["machine_info"]["w4a16"]["transformers"] == transformers.__version__
    out = tmp_path / "report"
    assert oracle_main(["report", str(tmp_path / "model_e2e.json"), "--out", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert "| model | workload | bf16 | w4a16 |" in text and "| llama3.1-8b-tiny | decode, batch 1 |" in text
    assert "- w4a16: PASS; layers: 14 of 14" in text
    assert HAS_GPU or "- skipped tinygemm: aten._weight_int4pack_mm runs on CUDA only" in text


def test_without_transformers_the_command_fails_first_saying_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    with pytest.raises(SystemExit, match=r"model_e2e needs transformers: pip install 'w4a16-oracle\[model\]'"):
        model_e2e.main(["--smoke", "--out", str(tmp_path)])
    assert not (tmp_path / "model_e2e.json").exists()


def test_unknown_provider_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit):
        model_e2e.parse_args(["--out", "x", "--providers", "bf16,marlin"])
    assert "unknown ['marlin'], choose from ['bf16', 'w4a16', 'w4a16-dense', 'tinygemm', 'torchao']" in \
        capsys.readouterr().err
