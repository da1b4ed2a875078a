"""Tolerances for comparing two float computations of one quantity whose sums run in different
orders: different kernel shapes or batchings (chunked vs full logits, fewer rows in a matmul,
packed vs padded, prefill vs decode). Such results are bitwise equal only where both sides run
the same kernels on the same shapes; how a CPU's BLAS blocks and vectorises a reduction (AVX2,
AVX-512, AMX) depends on the shape and on the CPU, so across shapes only a rounding bound
holds on every machine.

The bound: a float sum of n terms t_i, added in any order, is within gamma_n * sum_i |t_i| of
the exact sum, with gamma_n = n u / (1 - n u) ~ n u and u = eps / 2 the unit roundoff (each of
the n - 1 additions rounds once, relative error at most u, and an early partial sum passes
through at most n - 1 later roundings). Two orders are then within 2 gamma_n sum |t_i|
~ n eps sum |t_i| of each other. A result built from a chain of d reductions of at most n
terms each (a matmul's inner product, then a sum over tokens, ...) is within d n eps of its
absolute size per side, to first order.

``sum |t_i|`` is estimated by ``scale``, the largest magnitude in the reference tensor: a
tensor-wide absolute tolerance, so elements far below the largest (pure rounding noise, e.g.
the gradient of a parameter that barely touches the output) are held to the same absolute
bound as the rest. This is a worst-case bound: typical differences are far smaller (random
rounding errors grow like sqrt(n), not n), which is why it holds on every CPU rather than just
on the one where it was first run. Must not know about reroll.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2^-23: twice float32's unit roundoff


def reorder_atol(n_terms: int, scale: float | torch.Tensor, depth: int = 1,
                 eps: float = EPS32) -> float:
    """Absolute tolerance between two evaluations of the same value that add its terms in
    different orders: ``depth`` chained reductions of at most ``n_terms`` terms each, on
    values of magnitude up to ``scale`` (see the module docstring): depth * n * eps * scale."""
    s = float(scale.detach().abs().max()) if isinstance(scale, torch.Tensor) else abs(scale)
    return depth * n_terms * eps * s


def assert_reordered_close(got: torch.Tensor, want: torch.Tensor, n_terms: int,
                           depth: int = 1, msg: str | None = None,
                           scale: float | torch.Tensor | None = None) -> None:
    """``got`` equals ``want`` within ``reorder_atol`` of ``scale`` (default: ``want``'s
    largest magnitude; pass a larger one where ``want`` is a sum whose terms cancel)."""
    atol = reorder_atol(n_terms, want if scale is None else scale, depth)
    torch.testing.assert_close(got, want, rtol=0.0, atol=atol,
                               msg=None if msg is None else lambda m: f"{msg}: {m}")


def assert_steps_close(steps_a: list[list[torch.Tensor]], steps_b: list[list[torch.Tensor]],
                       n_terms: int) -> None:
    """The gradients of every optimiser step of two runs (one list of parameter gradients per
    step) agree within ``reorder_atol`` at the scale of the step's largest gradient entry:
    every gradient is built from the same backpropagated signal, so its terms are at most of
    that size even where they cancel to a much smaller sum (e.g. the key projections',
    differences of nearly equal softmax terms). Step k (from 1) is computed from weights
    that carry the rounding differences of the k - 1 updates before it, so its bound is k
    chained passes' (``depth = k``), to first order."""
    assert len(steps_a) == len(steps_b)
    for k, (g_a, g_b) in enumerate(zip(steps_a, steps_b, strict=True), start=1):
        assert len(g_a) == len(g_b)
        scale = max(float(x.abs().max()) for x in g_a)
        for i, (x, y) in enumerate(zip(g_a, g_b, strict=True)):
            assert_reordered_close(y, x, n_terms, depth=k, msg=f"step {k}, parameter {i}",
                                   scale=scale)
