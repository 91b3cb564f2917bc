"""CPU matmul formulations: every path of `cpu_kernels.linear` equals F.linear (fp32 exactly up to summation
order, bf16 within one rounding), a model gives the same logits with kernels on and off, and bad settings fail."""

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


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 24, 64, 65])
def test_fp32_matches_f_linear(M):
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


def test_bad_mode():
    with pytest.raises(ValueError, match="model.linear='fast'; valid: auto, torch"):
        cpu_kernels.set_mode("fast")
