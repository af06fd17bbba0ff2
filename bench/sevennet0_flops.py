#!/usr/bin/env python3
"""Arithmetic count of one SevenNet-0 energy + forces + stress evaluation.

Counts floating-point operations (1 multiply-add = 2 FLOP) per atom, given the
mean number of directed edges per atom (within 5 Å), from the architecture
(docs: node irreps 128x0e+64x1e+32x2e, 5 layers, radial MLP [8, 64, 64, W]):

  radial MLP   per edge and layer: 2 * (8*64 + 64*64 + 64*W)
  TP (uvu)     per edge and path (u copies of l1, filter l2, output l3), the
               cheapest dense form: T[a,k] = sum_b C[a,b,k] Y[b] once per edge,
               then out[u,k] = w[u] * sum_a x[u,a] T[a,k]:
               2*u*(2l1+1)*(2l3+1) + u*(2l3+1) (+ the small per-edge T)
  linears      per atom: 2 * sum over irreps of mul_in*mul_out*(2l+1)

The backward pass (forces via dE/dr_edge) costs about the forward again for
every product (input gradients only: the weights are fixed); a
recompute-in-backward implementation adds one more forward of the radial MLP.

Usage: python3 sevennet0_flops.py [EDGES_PER_ATOM] [GFLOPS]
  EDGES_PER_ATOM default 28.1 (rattled Si diamond, 5 Å); GFLOPS, when given,
  is a measured f32 GEMM rate and turns the count into a time floor.
"""
import sys

W = [384, 960, 960, 960, 224]
MUL = {0: 128, 1: 64, 2: 32}


def tp_paths(t):
    if t == 0:
        return [(128, 0, 0, 0), (128, 0, 1, 1), (128, 0, 2, 2)]
    if t == 4:
        return [(128, 0, 0, 0), (64, 1, 1, 0), (32, 2, 2, 0)]
    paths = []
    for l1 in (0, 1, 2):
        for l2 in (0, 1, 2):
            for l3 in range(abs(l1 - l2), min(l1 + l2, 2) + 1):
                paths.append((MUL[l1], l1, l2, l3))
    return paths


def tp_flops(paths):
    f = 0
    for u, l1, l2, l3 in paths:
        d1, d2, d3 = 2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1
        f += 2 * d1 * d2 * d3          # T = C . Y (per edge, shared over u)
        f += 2 * u * d1 * d3 + u * d3  # contraction with x, times the weight
    return f


def linear_flops(pairs):
    """pairs: (mul_in, mul_out, l)."""
    return sum(2 * a * b * (2 * l + 1) for a, b, l in pairs)


def per_layer_atom_linears(t):
    if t == 0:
        sc = [(128, 224, 0)]
        l1 = [(128, 128, 0)]
        l2 = [(128, 224, 0), (128, 64, 1), (128, 32, 2)]
    elif t == 4:
        sc = [(128, 128, 0)]
        l1 = [(128, 128, 0), (64, 64, 1), (32, 32, 2)]
        l2 = [(224, 128, 0)]
    else:
        sc = [(128, 224, 0), (64, 64, 1), (32, 32, 2)]
        l1 = [(128, 128, 0), (64, 64, 1), (32, 32, 2)]
        l2 = [(224, 224, 0), (384, 64, 1), (352, 32, 2)]
    return linear_flops(sc) + linear_flops(l1) + linear_flops(l2)


def main():
    epa = float(sys.argv[1]) if len(sys.argv) > 1 else 28.1
    gflops = float(sys.argv[2]) if len(sys.argv) > 2 else None
    mlp = sum(2 * (8 * 64 + 64 * 64 + 64 * w) for w in W)
    tp = sum(tp_flops(tp_paths(t)) for t in range(5))
    lin = sum(per_layer_atom_linears(t) for t in range(5)) + linear_flops([(89, 128, 0), (128, 64, 0), (64, 1, 0)])
    fwd_edge = mlp + tp
    fwd_atom = epa * fwd_edge + lin
    print(f"edges per atom           {epa:.1f}")
    print(f"radial MLP fwd / edge    {mlp:,} FLOP")
    print(f"tensor products fwd/edge {tp:,} FLOP")
    print(f"linears fwd / atom       {lin:,} FLOP")
    print(f"forward / atom           {fwd_atom / 1e6:.2f} MFLOP "
          f"(radial MLP {100 * epa * mlp / fwd_atom:.0f} %)")
    both = 2 * fwd_atom
    recompute = both + epa * mlp
    print(f"forward+backward / atom  {both / 1e6:.2f} MFLOP "
          f"({recompute / 1e6:.2f} with the radial MLP recomputed)")
    if gflops:
        print(f"floor at {gflops:.0f} GFLOP/s: {both / gflops / 1e3:.1f} us/atom/step "
              f"({recompute / gflops / 1e3:.1f} with recompute)")


if __name__ == "__main__":
    main()
