import pickle

import numpy as np

from charon_search.ir import Node, OpGraph, OpKind, Poly, TensorSpec, check, poly_params, sym


def test_poly_arithmetic_and_evaluation():
    b, s, c = sym("b"), sym("s"), sym("c")
    p = 2 * b * s * 4096 + 4 * b * s * c * 128
    assert p(b=2, s=10) == 2 * 2 * 10 * 4096 + 4 * 2 * 10 * 10 * 128
    assert p(b=1, s=1, c=100) == 2 * 4096 + 4 * 100 * 128
    assert p.subs(c=s) == 2 * b * s * 4096 + 512 * b * s * s
    assert pickle.loads(pickle.dumps(p)) == p
    assert Poly.from_json(p.to_json()) == p
    assert (p - p) == 0
    assert str(b * s * s) == "b*s^2"


def test_graph_evaluate_matches_poly_and_check_passes():
    b, s = sym("b"), sym("s")
    h = 64
    x = TensorSpec(id=0, shape=(b * s, Poly.const(h)), dtype="bf16")
    w = TensorSpec(id=1, shape=(Poly.const(h), Poly.const(h)), dtype="bf16")
    y = TensorSpec(id=2, shape=(b * s, Poly.const(h)), dtype="bf16")
    mm = Node(id=0, name="mm", kind=OpKind.GEMM, inputs=(0, 1), outputs=(2,),
              flops=2 * b * s * h * h, bytes_read=x.nbytes + w.nbytes, bytes_written=y.nbytes,
              params=poly_params(m=b * s, n=h, k=h))
    g = OpGraph(name="toy", nodes=(mm,), tensors={0: x, 1: w, 2: y}, inputs=(0, 1),
                outputs=(2,), param_tensors=(1,))
    check(g)
    ev = g.evaluate(b=3, s=100)
    assert np.isclose(ev.flops[0], 2 * 300 * h * h)
    assert np.isclose(ev.bytes[0], 2 * (300 * h * 2 + h * h))
    assert g.num_params() == h * h
    assert pickle.loads(pickle.dumps(g)).total_flops(3, 100) == g.total_flops(3, 100)


def test_division_by_monomial_is_exact():
    b, s = sym("b"), sym("s")
    assert (4 * b * s * s + 2 * s) / s == 4 * b * s + 2
    assert (6 * b * s) / (3 * b) == 2 * s
    import pytest

    with pytest.raises(TypeError):
        _ = (b * s) / (s * s)
    with pytest.raises(TypeError):
        _ = (b * s) / (b + s)
