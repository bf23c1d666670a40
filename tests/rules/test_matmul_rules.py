"""Golden table for MatMul / BatchMatMulV2 (cc/rules/matmul_rules.cc)."""

import pytest

from golden import plan

# (a, b, attrs) -> (a runs as, b runs as, output, collectives)
CASES = [
    ("[*,*]", "[*,*]", {}, "[*,*]", "[*,*]", "[*,*]", []),
    ("[x,*]", "[*,*]", {}, "[x,*]", "[*,*]", "[x,*]", []),
    ("[*,x]", "[x,*]", {}, "[*,x]", "[x,*]", "[*,*]", ["all-reduce(sum) of output 0 over x"]),
    ("[y,x]", "[x,*]", {}, "[y,x]", "[x,*]", "[y,*]", ["all-reduce(sum) of output 0 over x"]),
    ("[*,*]", "[*,y]", {}, "[*,*]", "[*,y]", "[*,y]", []),
    # Only one side of the contraction sharded: the other is sliced to match.
    ("[*,x]", "[*,*]", {}, "[*,x]", "[x,*]", "[*,*]",
     ["relayout input 1 [*,*] -> [x,*]", "all-reduce(sum) of output 0 over x"]),
    # x cannot shard both m and n: n gives it up.
    ("[x,*]", "[*,x]", {}, "[x,*]", "[*,*]", "[x,*]", ["relayout input 1 [*,x] -> [*,*]"]),
    ("[x,*]", "[*,*]", {"transpose_a": True}, "[x,*]", "[x,*]", "[*,*]",
     ["relayout input 1 [*,*] -> [x,*]", "all-reduce(sum) of output 0 over x"]),
]


@pytest.mark.parametrize("a,b,attrs,a_runs,b_runs,out,collectives", CASES,
                         ids=[f"{c[0]}-{c[1]}{'-T' if c[2] else ''}" for c in CASES])
def test_matmul(a, b, attrs, a_runs, b_runs, out, collectives):
    inputs, outputs, emitted = plan("MatMul", [a, b], [[8, 8], [8, 8]], attrs=attrs)
    assert inputs == [a_runs, b_runs]
    assert outputs == [out]
    assert emitted == collectives


def test_batch_matmul_merges_batch_axes():
    inputs, outputs, emitted = plan("BatchMatMulV2", ["[x,*,y]", "[*,y,*]"],
                                    [[4, 8, 8], [4, 8, 8]])
    assert outputs == ["[x,*,*]"]
    assert inputs == ["[x,*,y]", "[x,y,*]"]
    assert emitted == ["relayout input 1 [*,y,*] -> [x,y,*]",
                       "all-reduce(sum) of output 0 over y"]


def test_batch_matmul_broadcasts_rank():
    inputs, outputs, _ = plan("BatchMatMulV2", ["[x,*,*]", "[*,*]"], [[4, 8, 8], [8, 8]])
    assert outputs == ["[x,*,*]"]
    assert inputs == ["[x,*,*]", "[*,*]"]
