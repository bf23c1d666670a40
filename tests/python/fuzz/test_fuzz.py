"""The differential fuzzer: every op with a rule, random meshes, shapes, dtypes and layouts,
checked against one plain device (fuzz_engine.py; the op table is fuzz_ops.py).

Short run (default, part of `pytest`): a few derandomized cases per op. Long run:

    TF_DTENSOR_FUZZ_EXAMPLES=20000 pytest -q -s -p no:cacheprovider tests/python/fuzz

spreads that many cases over the ops (a fresh random draw each run unless
TF_DTENSOR_FUZZ_SEED is set) and prints a summary: cases per op and every mismatch.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import fuzz_engine
from dtensor_testing import LOWERINGS, layout_of
from fuzz_known import KNOWN_MISMATCHES
from fuzz_ops import EXCLUDED, OPS
from tf_dtensor import _core

LONG_RUN = bool(os.environ.get("TF_DTENSOR_FUZZ_EXAMPLES"))
SEED = os.environ.get("TF_DTENSOR_FUZZ_SEED")


def test_every_registered_op_is_in_the_table():
    registered = set(_core.registered_ops())
    missing = sorted(registered - set(OPS) - set(EXCLUDED))
    assert not missing, (f"ops with a rule but no fuzzer entry: {missing}; add them to "
                         f"tests/python/fuzz/fuzz_ops.py (or to EXCLUDED, with the reason)")
    stale = sorted((set(OPS) | set(EXCLUDED)) - registered)
    assert not stale, f"fuzzer entries for ops without a rule: {stale}"
    assert not set(OPS) & set(EXCLUDED), sorted(set(OPS) & set(EXCLUDED))


@pytest.fixture(scope="module", autouse=True)
def _summary(pytestconfig):
    yield
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + fuzz_engine.LOG.summary())


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    derandomize=not LONG_RUN and SEED is None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_fuzz(op_name, pytestconfig):
    spec = OPS[op_name]
    known = [k for k in KNOWN_MISMATCHES if k.op == op_name]
    examples = fuzz_engine.examples_per_op(len(OPS))

    @_settings(examples)
    @given(data=st.data())
    def run(data):
        fuzz_engine.run_case(spec, data, known)

    if SEED is not None:
        run = seed(int(SEED))(run)
    before = len(fuzz_engine.LOG.mismatches[op_name])
    try:
        run()
    finally:
        if LONG_RUN:   # progress, readable while the run goes on
            log = fuzz_engine.LOG
            capture = pytestconfig.pluginmanager.getplugin("capturemanager")
            with capture.global_and_fixture_disabled():
                print(f"\n[fuzz] {op_name}: {log.cases[op_name]} cases, "
                      f"{len(log.mismatches[op_name])} mismatches; total "
                      f"{sum(log.cases.values())} cases, "
                      f"{sum(len(v) for v in log.mismatches.values())} mismatches, "
                      f"{log.seconds:.0f} s", flush=True)
    found = fuzz_engine.LOG.mismatches[op_name][before:]
    assert not found, f"{len(found)} mismatches for {op_name}; the first:\n{found[0]}"


def _known_case(entry: fuzz_engine.KnownMismatch):
    mesh = next(m for m in fuzz_engine.MESHES if m.short() == entry.mesh)
    d = fuzz_engine.Drawer(None, seed=0)
    d.mesh = mesh
    arrays = {arg: d.array(shape, dtype) for arg, dtype, shape, _ in entry.inputs}
    if entry.derive is not None:
        arrays.update(entry.derive(arrays, dict(entry.attrs)))
    args = {arg: fuzz_engine.T(value) for arg, value in arrays.items()}
    layouts = [layout_of(spec, mesh) for _, _, _, spec in entry.inputs]
    return fuzz_engine.Call(args, dict(entry.attrs)), layouts, d


@pytest.mark.parametrize("entry", [
    pytest.param(k, id=f"{k.op}-{k.mesh}-{'-'.join(s for *_, s in k.inputs)}",
                 marks=pytest.mark.xfail(strict=k.strict, reason=k.reason, raises=AssertionError))
    for k in KNOWN_MISMATCHES])
def test_known_mismatch_still_fails(entry):
    """Each known mismatch, run exactly (not left to what a short run draws); strict entries
    pass once the cause is gone, which fails here: then remove the entry."""
    call, layouts, d = _known_case(entry)
    assert fuzz_engine.describe(entry.op, call, layouts) == entry.case()
    for lowering in LOWERINGS if entry.lowering is None else [entry.lowering]:
        fuzz_engine.check_case(OPS[entry.op], call, layouts, d, lowering)
