"""The hooks' building blocks against what torch's hooks use, in one process (no process group):

* ``NumpyRandomState`` (C++) draws what numpy's legacy ``RandomState`` draws, for many seeds and bounds;
* the fused fp16/bf16 compression equals ``x.to(dtype).div_(world_size)`` bit for bit, special values included
  (NaNs: NaN-ness only; torch's own NaN bits differ between its vector loop and its scalar tail), and
  decompression equals ``copy_``, at every SIMD level, in place and into another buffer, at odd offsets;
* ``orthogonalize`` equals torch's ``_orthogonalize``: to float tolerance for rank <= 2 (our Gram-Schmidt loop),
  bit for bit above (QR), and fp16 Gram-Schmidt (ATen, torch's op sequence) bit for bit;
* the low-rank products (P = M Q, Q = M^T P, M = P Q^T with the error in the same pass) agree with torch's
  matmuls at every SIMD level, rank and shape (odd sizes, rank above 4, fallbacks for non-contiguous input).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

import tunedist  # noqa: F401
from tunedist import _C

hooks = _C._hooks


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**31 - 1, 2**32 - 1])
def test_random_state_matches_numpy_bounds(seed):
    ours, ref = hooks.NumpyRandomState(seed), np.random.RandomState(seed)
    for high in [1, 2, 3, 10, 1_000_000_000, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40, 2**62 + 3, 2**63 - 1]:
        for _ in range(5):
            assert ours.randint(high) == ref.randint(high), f"seed {seed}, high {high}"


def test_random_state_matches_numpy_many_seeds():
    # The draw PowerSGD makes each step, over many seeds and long sequences (crossing MT's 624-word blocks).
    for seed in list(range(200)) + [int(s) for s in np.random.RandomState(99).randint(0, 2**32, 50, dtype=np.uint64)]:
        ours, ref = hooks.NumpyRandomState(seed), np.random.RandomState(seed)
        drawn = [ours.randint(1_000_000_000) for _ in range(40)]
        assert drawn == [int(ref.randint(1_000_000_000)) for _ in range(40)], f"seed {seed}"
    ours, ref = hooks.NumpyRandomState(5), np.random.RandomState(5)
    assert [ours.next_uint32() for _ in range(2000)] == ref.randint(0, 2**32, 2000, dtype=np.uint64).tolist()


def test_random_state_rejects_empty_range():
    with pytest.raises(ValueError, match="high must be positive"):
        hooks.NumpyRandomState(0).randint(0)


def _special_values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(100_003, generator=gen) * torch.logspace(-12, 6, 100_003)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65520.0, 1e-8, -6e-8,
                             3.0e38, 1.17e-38, 2.0**-24, 2.0**-25])
    return torch.cat([x, specials])


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")])
@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_compress_matches_torch_cast_then_divide(dtype, world_size):
    x = _special_values()
    out = torch.empty(x.numel(), dtype=dtype)
    hooks.compress_into(out, x, world_size)
    ref = x.to(dtype).div_(world_size)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) or torch.equal(
        torch.nan_to_num(out.float(), nan=7.0), torch.nan_to_num(ref.float(), nan=7.0))
    back = torch.empty_like(x)
    hooks.decompress_into(back, out)
    assert torch.equal(torch.nan_to_num(back, nan=7.0), torch.nan_to_num(out.float(), nan=7.0))


_LEVELS = ["scalar", "avx2", "avx512"]
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(params=_LEVELS)
def simd_level(request):
    order = _LEVELS.index
    if order(request.param) > order(_C.best_simd_level()):
        pytest.skip(f"this CPU has no {request.param}")
    _C.force_simd_level(request.param)
    yield request.param
    _C.reset_simd_level()


def _assert_same_low(out: torch.Tensor, ref: torch.Tensor):
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out.view(torch.int16)[~nan], ref.view(torch.int16)[~nan])


def _assert_same_float(out: torch.Tensor, ref: torch.Tensor):
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out.view(torch.int32)[~nan], ref.view(torch.int32)[~nan])


def _inputs(n: int) -> torch.Tensor:
    """n values: random magnitudes over fp16's and bf16's whole ranges, with specials and halfway ties mixed in."""
    base = _special_values()
    ties = torch.tensor([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3 * 2.0**-25,
                         2.0**-24 + 2.0**-26, 1e-40, -1e-45, float("nan"), -float("nan")])
    pool = torch.cat([ties, base[-13:], base])
    return pool.repeat(n // pool.numel() + 1)[:n].clone()


_SIZES = [0, 1, 7, 8, 9, 1000, 1000003]


@pytest.mark.parametrize("precision", list(_DTYPES))
def test_fused_kernels_match_torch_at_every_level(simd_level, precision):
    dtype = _DTYPES[precision]
    for n in _SIZES:
        for world_size in [1, 3, 7]:
            x = _inputs(n)
            ref = x.to(dtype).div_(world_size)
            # Into another buffer, both at odd (unaligned) element offsets.
            src = torch.cat([torch.zeros(1), x])[1:]
            dst = torch.empty(n + 1, dtype=dtype)[1:]
            hooks.compress_into(dst, src, world_size)
            _assert_same_low(dst, ref)
            wide = torch.empty(n + 3)[3:]
            hooks.decompress_into(wide, dst)
            _assert_same_float(wide, ref.float())
            # In place, in a bucket that starts at an odd offset of its storage.
            bucket = torch.cat([torch.zeros(1), x])[1:]
            view = hooks.compress_in_place(bucket, precision, world_size)
            assert view.data_ptr() == bucket.data_ptr() and view.dtype == dtype
            _assert_same_low(view, ref)
            hooks.decompress_in_place(bucket, view)
            _assert_same_float(bucket, ref.float())


def test_fused_kernels_refuse_partial_overlap():
    storage = torch.zeros(16)
    with pytest.raises(RuntimeError, match="overlap partially"):
        hooks.compress_into(storage[4:].view(torch.float16)[:8], storage[:8], 2)


def test_force_simd_level_rejects_unknown_level():
    with pytest.raises(ValueError, match="unknown SIMD level 'sse9'"):
        _C.force_simd_level("sse9")


def test_compress_rejects_mismatched_sizes():
    with pytest.raises(RuntimeError, match="compressInto: sizes differ"):
        hooks.compress_into(torch.empty(3, dtype=torch.float16), torch.zeros(4), 2)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
@pytest.mark.parametrize("eps", [0.0, 1e-8])
def test_orthogonalize_matches_torch(rank, eps):
    gen = torch.Generator().manual_seed(rank)
    m = torch.randn(3, 37, rank, generator=gen)
    ours, ref = m.clone(), m.clone()
    hooks.orthogonalize(ours, eps)
    _orthogonalize(ref, eps)
    if rank <= 2:  # our Gram-Schmidt loop (sums in double): float tolerance
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        assert not torch.equal(ours, m)
    else:  # torch.linalg.qr, as torch's
        assert torch.equal(ours, ref)
    q = ours[0]
    torch.testing.assert_close(q.T @ q, torch.eye(rank), atol=1e-5, rtol=0)


def test_orthogonalize_rejects_2d():
    with pytest.raises(RuntimeError, match=r"\(B, rows, r\)"):
        hooks.orthogonalize(torch.zeros(4, 2), 0.0)


def test_orthogonalize_fp16_follows_torch_bit_for_bit():
    m = torch.randn(2, 29, 2, generator=torch.Generator().manual_seed(5)).half()
    ours, ref = m.clone(), m.clone()
    hooks.orthogonalize(ours, 0.0)
    _orthogonalize(ref, 0.0)
    assert torch.equal(ours, ref)


def test_orthogonalize_zero_column_gives_nan_as_torch():
    ours, ref = torch.zeros(1, 8, 2), torch.zeros(1, 8, 2)
    hooks.orthogonalize(ours, 0.0)
    _orthogonalize(ref, 0.0)
    assert ours.isnan().all() and ref.isnan().all()


# Shapes of real layers and odd ones: rows/columns not multiples of the 8-float vectors, a single row, r above the
# 4-column blocks of the kernels.
_LOW_RANK_SHAPES = [(512, 384, 1), (256, 512, 2), (37, 13, 3), (1, 9, 1), (9, 1, 1), (300, 301, 4), (64, 40, 7),
                    (8, 8, 8), (7, 93, 1), (6, 90, 2)]


def _assert_float_product(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, extra=None):
    """got ~ a @ b (+ extra): within the worst-case float32 rounding of a k-term dot product, k * 2^-24 of the sum
    of the terms' magnitudes (+ one rounding of the result), computed exactly in float64."""
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64
    scale = a64.abs() @ b64.abs()
    if extra is not None:
        exact = extra.double() - exact
        scale = scale + extra.double().abs()
    bound = (a.shape[1] + 2) * 2.0**-24 * scale + 1e-30
    err = (got.double() - exact).abs()
    assert bool((err <= bound).all()), f"worst error {(err / bound).max().item():.2f}x the float32 bound"


@pytest.mark.parametrize("n,m,r", _LOW_RANK_SHAPES, ids=lambda v: str(v))
def test_low_rank_products_match_torch_at_every_level(simd_level, n, m, r):
    gen = torch.Generator().manual_seed(n * 1000 + m * 10 + r)
    mat = torch.randn(n, m, generator=gen)
    q = torch.randn(m, r, generator=gen)
    p = torch.full((n, r), float("nan"))
    hooks.multiply_mq(mat, q, p)
    _assert_float_product(p, mat, q)
    q2 = torch.full((m, r), float("nan"))
    hooks.multiply_mtp(mat, p, q2)
    _assert_float_product(q2, mat.T, p)
    # out = p q2^T with the error of the old values, in one pass.
    out, err = mat.clone(), torch.full((n, m), float("nan"))
    hooks.write_pqt(out, p, q2, err)
    _assert_float_product(out, p, q2.T)
    _assert_float_product(err, p, q2.T, extra=mat)
    out2 = mat.clone()
    hooks.write_pqt(out2, p, q2)
    assert torch.equal(out2, out)


def test_low_rank_rank_one_decompression_is_the_rounded_product():
    # At r = 1 each element is the single product p_i * q_j, as BLAS computes it: the same bits as torch.
    gen = torch.Generator().manual_seed(1)
    p, q = torch.randn(33, 1, generator=gen), torch.randn(70, 1, generator=gen)
    out = torch.empty(33, 70)
    hooks.write_pqt(out, p, q)
    assert torch.equal(out, p @ q.T)


def test_low_rank_products_fall_back_to_aten_off_the_fast_path():
    gen = torch.Generator().manual_seed(2)
    mat = torch.randn(40, 24, generator=gen, dtype=torch.float64)  # not float32: ATen's mm, bit for bit
    q = torch.randn(24, 2, generator=gen, dtype=torch.float64)
    p = torch.empty(40, 2, dtype=torch.float64)
    hooks.multiply_mq(mat, q, p)
    assert torch.equal(p, mat @ q)
    t = torch.randn(24, 40, generator=gen).T  # float32 but not contiguous
    q32 = torch.randn(24, 3, generator=gen)
    p32 = torch.empty(40, 3)
    hooks.multiply_mq(t, q32, p32)
    assert torch.equal(p32, t @ q32)
    with pytest.raises(RuntimeError, match="error slice needs contiguous CPU float32"):
        hooks.write_pqt(torch.empty(40, 24, dtype=torch.float64), p, q, torch.empty(40 * 24, dtype=torch.float64))


def test_low_rank_products_reject_mismatched_shapes():
    with pytest.raises(RuntimeError, match=r"multiplyMQ: expects M \(n, m\), P \(n, r\) and Q \(m, r\)"):
        hooks.multiply_mq(torch.zeros(4, 5), torch.zeros(4, 2), torch.zeros(4, 2))
