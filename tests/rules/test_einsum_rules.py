"""Golden table for Einsum (cc/rules/einsum_rules.cc): each letter of the equation is a
factor; letters only in the inputs are contracted and leave partial sums when sharded."""

import pytest

from golden import MESH_2, MESH_2X2, backward, layout, plan
from tf_dtensor import debug, dtensor

# (equation, specs, shapes) -> (inputs run as, output, collectives)
CASES = [
    ("ij,jk->ik", ["[x,*]", "[*,y]"], [[8, 8], [8, 8]], ["[x,*]", "[*,y]"], "[x,y]", []),
    # Contracted j sharded: partial sums, all-reduced.
    ("ij,jk->ik", ["[*,x]", "[x,y]"], [[8, 8], [8, 8]], ["[*,x]", "[x,y]"], "[*,y]",
     ["all-reduce(sum) of output 0 over x"]),
    # One side of j sharded: the other is sliced to match (free).
    ("ij,jk->ik", ["[*,x]", "[*,*]"], [[8, 8], [8, 8]], ["[*,x]", "[x,*]"], "[*,*]",
     ["relayout input 1 [*,*] -> [x,*]", "all-reduce(sum) of output 0 over x"]),
    # Attention scores: b, h, q, k pass through, d is contracted.
    ("bqhd,bkhd->bhqk", ["[x,*,*,y]", "[x,*,*,y]"], [[2, 4, 2, 4], [2, 6, 2, 4]],
     ["[x,*,*,y]", "[x,*,*,y]"], "[x,*,*,*]", ["all-reduce(sum) of output 0 over y"]),
    ("bqhd,bkhd->bhqk", ["[x,*,y,*]", "[*,*,*,*]"], [[2, 4, 2, 4], [2, 6, 2, 4]],
     ["[x,*,y,*]", "[x,*,y,*]"], "[x,y,*,*]",
     ["relayout input 1 [*,*,*,*] -> [x,*,y,*]"]),
    # Attention output: k is contracted.
    ("bhqk,bkhd->bqhd", ["[x,y,*,*]", "[x,*,y,*]"], [[2, 2, 4, 6], [2, 6, 2, 4]],
     ["[x,y,*,*]", "[x,*,y,*]"], "[x,*,y,*]", []),
    # Factors claim mesh dimensions in output order: b (from the second operand) takes x
    # before q does, so the first operand's q gives it up.
    ("bqhd,bkhd->bhqk", ["[*,x,*,*]", "[x,*,*,*]"], [[2, 4, 2, 4], [2, 6, 2, 4]],
     ["[x,*,*,*]", "[x,*,*,*]"], "[x,*,*,*]", ["relayout input 0 [*,x,*,*] -> [x,*,*,*]"]),
    ("ij->ji", ["[x,y]"], [[8, 8]], ["[x,y]"], "[y,x]", []),
    ("ij->", ["[x,y]"], [[8, 8]], ["[x,y]"], "[]", ["all-reduce(sum) of output 0 over x,y"]),
    ("i,i->", ["[x]", "[*]"], [[8], [8]], ["[x]", "[x]"], "[]",
     ["relayout input 1 [*] -> [x]", "all-reduce(sum) of output 0 over x"]),
    ("i,j->ij", ["[y]", "[x]"], [[8], [8]], ["[y]", "[x]"], "[y,x]", []),
    # A diagonal: the repeated letter is gathered.
    ("ii->i", ["[x,y]"], [[8, 8]], ["[*,*]"], "[*]", ["relayout input 0 [x,y] -> [*,*]"]),
    ("iij->ij", ["[x,*,y]"], [[2, 2, 8]], ["[*,*,y]"], "[*,y]",
     ["relayout input 0 [x,*,y] -> [*,*,y]"]),
    # A letter repeated in the output (einsum's gradient of a diagonal) is replicated.
    ("i->ii", ["[x]"], [[8]], ["[*]"], "[*,*]", ["relayout input 0 [x] -> [*]"]),
    # Ellipsis: broadcast axes aligned from the right; a size-1 axis never shards.
    ("...ij,...jk->...ik", ["[x,*,y]", "[y,*]"], [[2, 4, 8], [8, 4]],
     ["[x,*,y]", "[y,*]"], "[x,*,*]", ["all-reduce(sum) of output 0 over y"]),
    ("...ij,...jk->...ik", ["[*,*,*,*]", "[x,*,*]"], [[2, 1, 4, 8], [3, 8, 4]],
     ["[*,*,*,*]", "[x,*,*]"], "[*,x,*,*]", []),
]


@pytest.mark.parametrize("equation,specs,shapes,runs,out,collectives", CASES,
                         ids=[f"{c[0]}-{'-'.join(c[1])}" for c in CASES])
def test_einsum(equation, specs, shapes, runs, out, collectives):
    inputs, outputs, emitted = plan("Einsum", specs, shapes, attrs={"equation": equation})
    assert inputs == runs
    assert outputs == [out]
    assert emitted == collectives


def test_einsum_passes_a_pending_sum_through():
    # Linear in each operand: a pending sum on one input reaches the output unreduced.
    pending = dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], MESH_2X2,
                             partial={"y": "sum"})
    result = debug.explain("Einsum", [pending, layout("[*,*]")], [[8, 8], [8, 8]],
                           attrs={"equation": "ij,jk->ik"})
    assert result["outputs"][0] == pending
    assert "outputs stay partial(y:sum)" in result["collectives"]


def test_einsum_on_a_1d_mesh():
    inputs, outputs, emitted = plan("Einsum", ["[*,x,*,*]", "[*,x,*,*]"],
                                    [[2, 4, 2, 4], [2, 6, 2, 4]], mesh=MESH_2,
                                    attrs={"equation": "bqhd,bkhd->bhqk"})
    assert inputs == ["[*,x,*,*]", "[*,*,*,*]"]
    assert outputs == ["[*,*,x,*]"]
    assert emitted == ["relayout input 1 [*,x,*,*] -> [*,*,*,*]"]


# (equation, shapes, wanted output) -> per input, the spec Backward asks for.
BACKWARD = [
    ("ij,jk->ik", [[8, 4], [4, 6]], "[x,y]", ["[x,*]", "[*,y]"]),
    ("bqhd,bkhd->bhqk", [[2, 4, 2, 4], [2, 6, 2, 4]], "[x,y,*,*]",
     ["[x,*,y,*]", "[x,*,y,*]"]),
    ("bhqk,bkhd->bqhd", [[2, 2, 4, 6], [2, 6, 2, 4]], "[x,*,y,*]",
     ["[x,y,*,*]", "[x,*,y,*]"]),
    ("ij->ji", [[8, 4]], "[x,y]", ["[y,x]"]),
    ("ij->i", [[8, 4]], "[y]", ["[y,*]"]),
    ("i,j->ij", [[4], [8]], "[x,y]", ["[x]", "[y]"]),
    # A diagonal is never asked for sharded.
    ("iij->ij", [[2, 2, 8]], "[x,y]", ["[*,*,y]"]),
    # A broadcasting size-1 axis is asked for unsharded.
    ("...ij,...jk->...ik", [[2, 1, 4, 8], [4, 8, 4]], "[x,y,*,*]",
     ["[x,*,*,*]", "[y,*,*]"]),
]


@pytest.mark.parametrize("equation,shapes,wanted,expected", BACKWARD,
                         ids=[f"{c[0]}-{c[2]}" for c in BACKWARD])
def test_einsum_backward(equation, shapes, wanted, expected):
    assert backward("Einsum", shapes, [wanted], attrs={"equation": equation}) == expected
