"""CPU matmul formulations: every path of `cpu_kernels.linear` equals F.linear (fp32 exactly up to summation
order, bf16 within one rounding), choices are measured once per machine and cached, a model gives the same
logits with kernels on and off, and bad settings fail."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbench.models import cpu_kernels
from specbench.models.cpu_kernels import linear


@pytest.fixture(autouse=True)
def _restore_mode():
    yield
    cpu_kernels.set_mode("auto")


@pytest.mark.parametrize("how", ["torch", "wxt"])
@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 24, 64, 65])
def test_fp32_matches_f_linear(M, how, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "choice", lambda *a: how)
    g = torch.Generator().manual_seed(M)
    x, w, b = torch.randn(M, 96, generator=g), torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear(x.view(1, M, 96), w), F.linear(x.view(1, M, 96), w), atol=1e-5, rtol=1e-5)


def test_bf16_kernel_matches_f_linear_in_float32():
    """Needs a C++ compiler (the kernel builds on first use); on CPUs with native bf16 it is not used at all."""
    with torch.inference_mode():
        ext = cpu_kernels.bf16_kernel()
        if cpu_kernels.cpu_has_native_bf16():
            assert ext is None
            return
        assert ext is not None, "the AVX2 bf16 kernel should build on this machine"
        g = torch.Generator().manual_seed(0)
        for M, N in ((1, 1000), (1, 1003), (3, 1000), (4, 1001), (5, 1000), (9, 1002), (64, 1000), (300, 1003)):
            x = torch.randn(M, 576, generator=g).bfloat16()  # N % 4 != 0: the tile tails; M = 300: prefill slices
            w = torch.randn(N, 576, generator=g).bfloat16()
            ref = F.linear(x.float(), w.float())
            got = linear(x, w)
            assert got.dtype == torch.bfloat16 and got.shape == (M, N)
            # fp32 accumulation, one rounding to bf16: within one bf16 ulp of the fp32 result
            assert ((got.float() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-3).all()


def test_model_logits_with_and_without_kernels(tiny_dir):
    from specbench.models.loading import load_model

    lm = load_model(str(tiny_dir), torch.float32, torch.device("cpu"))
    ids = torch.tensor([[5, 17, 99, 3, 250, 7]])
    with torch.inference_mode():
        on = lm.model(ids, None).logits
        cpu_kernels.set_mode("torch")
        off = lm.model(ids, None).logits
    torch.testing.assert_close(on, off, atol=1e-5, rtol=1e-5)


def test_choices_are_measured_once_and_cached(tmp_path, monkeypatch):
    """First use measures (here: a stand-in that counts), the table lands on disk keyed by the CPU and torch,
    and a fresh process state reads it back instead of measuring again."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setitem(cpu_kernels._state, "table", None)
    monkeypatch.setitem(cpu_kernels._state, "memo", {})
    calls = []
    monkeypatch.setattr(cpu_kernels, "_measure", lambda dt, K, N, M: calls.append((K, N, M)) or "wxt")
    assert cpu_kernels.choice(torch.float32, 256, 512, 3) == "wxt"  # bucket 4
    assert cpu_kernels.choice(torch.float32, 256, 512, 4) == "wxt" and calls == [(256, 512, 4)]
    assert cpu_kernels.choice(torch.float32, 16, 16, 4) == "torch" and len(calls) == 1  # too small to matter
    files = list((tmp_path / "linear").glob("choices-*.json"))
    assert len(files) == 1 and "float32:256x512:4" in files[0].read_text()
    cpu_kernels._state["table"] = None  # as a new process would start
    assert cpu_kernels.choice(torch.float32, 256, 512, 2) == "wxt" and len(calls) == 2  # new bucket: measured
    assert cpu_kernels.choice(torch.float32, 256, 512, 4) == "wxt" and len(calls) == 2  # from disk
    assert cpu_kernels.describe(torch.float32)["choices"] == {"float32:256x512:2": "wxt", "float32:256x512:4": "wxt"}


def test_measurement_picks_a_real_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setitem(cpu_kernels._state, "table", None)
    monkeypatch.setitem(cpu_kernels._state, "memo", {})
    assert cpu_kernels._measure(torch.float32, 256, 512, 2) in ("torch", "wxt")


def test_bad_mode():
    with pytest.raises(ValueError, match="model.linear='fast'; valid: auto, torch"):
        cpu_kernels.set_mode("fast")
