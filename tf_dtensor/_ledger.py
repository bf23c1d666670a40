"""The collective ledger: `debug.collectives()` records every collective tf_dtensor issues.

The C++ builders note each all-reduce, all-gather, all-to-all and reduce-scatter where they
hand it to the collective layer (cc/spmd/ledger.h): eagerly as it is issued, and for a
`tf.function` what its expansion emitted, added once per call. A record says what moved
and why:

    kind            all-reduce / all-gather / all-to-all / reduce-scatter
    reduction       sum, max, ... for the reductions
    mesh_dims       the mesh dimensions it runs over; group_size devices per group
    layout_in/out   the value's layout before and after ("[x,*] +partial(y:sum)")
    shape, dtype    the value's global shape and dtype
    block_bytes     one device's input block
    bytes_per_device  what each device receives, in the ring model: all-gather (g-1)*B
                    (uneven blocks: the most any device receives), all-reduce
                    2(g-1)/g*B, reduce-scatter and all-to-all (g-1)/g*B
    op              the op whose expansion issued it (`MatMul`, `TfDTensorRelayout`, ...)
    requested       the user's relayout (or copy_to_mesh) asked for it; else a rule
                    implied it (a contraction's reduction, an input brought to the plan)
    combined        inside a function, joined with other all-reduces into one collective
                    (the bytes are the same; the count of collective ops is lower)
    in_loop         in a loop body: issued once per iteration, listed once per call
    in_branch       in a branch of a conditional: both branches are listed, one runs
    branch          which one: "'cond' then", "'cond' else", "'case' branch 2" (the
                    conditional's node), outer ones first ("'a' then / 'b' else")
    where           "eager" or the tf.function's name
    line            the user's source line ("train.py:42") of the eager op that issued it,
                    or of the tf.function call; the first caller's frame outside
                    TensorFlow, Keras, tf_dtensor and the standard library ("" if none)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import sysconfig
from typing import Dict, Iterator, List, Optional, Tuple

from tensorflow.python.framework import dtypes

from tf_dtensor import _core


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective as issued (see the module docstring for the fields)."""
    kind: str
    reduction: str
    mesh: str
    mesh_dims: Tuple[str, ...]
    group_size: int
    layout_in: str
    layout_out: str
    shape: Tuple[int, ...]
    dtype: dtypes.DType
    block_bytes: int
    bytes_per_device: int
    op: str
    requested: bool
    combined: bool
    in_loop: bool
    in_branch: bool
    where: str
    line: str = ""
    branch: str = ""

    @property
    def label(self) -> str:
        """"all-reduce(sum) over model", "all-gather over x+y"."""
        kind = f"{self.kind}({self.reduction})" if self.reduction else self.kind
        return f"{kind} over {'+'.join(self.mesh_dims) or '-'}"


def _record(raw: Dict) -> Collective:
    fields = dict(raw)
    fields["mesh_dims"] = tuple(fields["mesh_dims"])
    fields["shape"] = tuple(fields["shape"])
    fields["dtype"] = dtypes.as_dtype(fields["dtype"])
    return Collective(**fields)


class Ledger:
    """The collectives issued inside one `debug.collectives()` block, in issue order: by
    the block's own thread, and by threads with no ledger open (TensorFlow's executor
    threads); another thread's open ledger keeps that thread's.

    Filled when the block ends. `len(ledger)`, iteration and indexing give the
    `Collective` records; `count` and `total_bytes` sum them with optional filters;
    `table()` prints them grouped by op; `plot(path)` draws bytes per op as a PNG.
    """

    def __init__(self) -> None:
        self._records: List[Collective] = []
        self._open = True

    @classmethod
    def _of(cls, records: List[Collective]) -> "Ledger":
        """A closed ledger of `records` (what `debug.estimate` planned)."""
        ledger = cls()
        ledger._records = list(records)
        ledger._open = False
        return ledger

    @property
    def records(self) -> List[Collective]:
        return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Collective]:
        return iter(self._records)

    def __getitem__(self, index: int) -> Collective:
        return self._records[index]

    def select(self, kind: Optional[str] = None, mesh_dim: Optional[str] = None,
               op: Optional[str] = None, requested: Optional[bool] = None,
               where: Optional[str] = None, line: Optional[str] = None,
               in_branch: Optional[bool] = None,
               branch: Optional[str] = None) -> List[Collective]:
        """The records of `kind` ("all-reduce", ...), over `mesh_dim` (among others), issued
        for `op`, asked for by the user (`requested=True`) or implied by a rule (`False`),
        eagerly (`where="eager"`) or in a tf.function (its name), from a source `line`
        ("train.py:42", matched at the end of the path), in a branch of a conditional
        (`in_branch=True`: listed for every branch, though one branch runs per call;
        `False`: the collectives that ran whichever branch was taken), in a `branch` whose
        name contains the text given ("then", "'cond' else"); None matches all."""
        return [r for r in self._records
                if (kind is None or r.kind == kind)
                and (mesh_dim is None or mesh_dim in r.mesh_dims)
                and (op is None or r.op == op)
                and (requested is None or r.requested == requested)
                and (in_branch is None or r.in_branch == in_branch)
                and (branch is None or branch in r.branch)
                and (where is None or where in (r.where, _function_name(r.where)))
                and (line is None or _same_line(r.line, line))]

    def count(self, **filters) -> int:
        """How many collectives match `filters` (as `select`)."""
        return len(self.select(**filters))

    def total_bytes(self, **filters) -> int:
        """The bytes each device receives over the matching collectives (`select`'s
        filters), summed."""
        return sum(r.bytes_per_device for r in self.select(**filters))

    def by_op(self) -> "collections.OrderedDict[Tuple[str, str], List[Collective]]":
        """Records grouped by (where, op), in first-issue order."""
        groups: "collections.OrderedDict[Tuple[str, str], List[Collective]]" = \
            collections.OrderedDict()
        for r in self._records:
            groups.setdefault((_function_name(r.where), _op_name(r.op) or "-"), []).append(r)
        return groups

    def table(self) -> str:
        """The ledger as text, one line per op and kind of collective:

            where       op        collective              n  bytes/device  layout ...  why    line
            eager       MatMul    all-reduce(sum) over y  1        32 KiB  ...         rule   mlp.py:12
            train_step  relayout  all-gather over x       2        64 KiB  ...         asked  mlp.py:30
            total                                         3        96 KiB
        """
        rows = [("where", "op", "collective", "n", "bytes/device", "layout", "why", "line")]
        for (where, op), records in self.by_op().items():
            kinds: "collections.OrderedDict[Tuple, List[Collective]]" = collections.OrderedDict()
            for r in records:
                kinds.setdefault((r.label, r.layout_in, r.requested, r.in_loop, r.branch,
                                  r.combined, os.path.basename(r.line)), []).append(r)
            for (label, layout, asked, in_loop, branch, combined, line), same in \
                    kinds.items():
                why = "asked" if asked else "rule"
                if combined:
                    why += ", combined"
                if in_loop:
                    why += ", per iteration"
                if branch:
                    why += f", if {branch} runs"
                rows.append((where, op, label, str(len(same)),
                             _bytes(sum(r.bytes_per_device for r in same)),
                             f"{layout} -> {same[0].layout_out}", why, line))
        # The total adds every record once: say which of them may run more often (a loop
        # body's) or not at all (a branch's; one branch of a conditional runs per call).
        caveats = []
        looped = [r for r in self._records if r.in_loop]
        if looped:
            caveats.append(f"{len(looped)} per iteration")
        branched = [r for r in self._records if r.in_branch]
        if branched:
            caveats.append(f"{len(branched)} ({_bytes(sum(r.bytes_per_device for r in branched))})"
                           f" if their branches run")
        rows.append(("total", "", "", str(len(self._records)), _bytes(self.total_bytes()),
                     "", "of which " + ", ".join(caveats) if caveats else "", ""))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = []
        for row in rows:
            cells = [cell.rjust(w) if i in (3, 4) else cell.ljust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))]
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)

    def plot(self, path: str, title: Optional[str] = None) -> None:
        """Draws the ledger as a PNG at `path`: one bar per op (and where), its bytes per
        device stacked by the mesh dimensions the collectives ran over. Needs matplotlib
        (`pip install "tf_dtensor[viz]"`)."""
        from tf_dtensor import _block_picture  # pylint: disable=import-outside-toplevel
        colormaps, FigureCanvasAgg, Figure, _ = _block_picture._matplotlib()  # pylint: disable=protected-access
        groups = self.by_op()
        places = {where for where, _ in groups}
        names = [op if len(places) == 1 else f"{op}\n({where})" for where, op in groups]
        dims = sorted({"+".join(r.mesh_dims) for r in self._records})
        figure = Figure(figsize=(max(4.0, 1.2 * len(names) + 2), 3.6))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot(1, 1, 1)
        colours = colormaps["tab10"]
        bottoms = [0.0] * len(names)
        for k, dim in enumerate(dims):
            heights = [sum(r.bytes_per_device for r in records if "+".join(r.mesh_dims) == dim)
                       for records in groups.values()]
            axes.bar(range(len(names)), heights, bottom=bottoms, color=colours(k % 10),
                     label=f"over {dim}")
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for i, records in enumerate(groups.values()):
            axes.annotate(f"{len(records)}x", (i, bottoms[i]), ha="center", va="bottom",
                          fontsize=8)
        axes.set_xticks(range(len(names)))
        axes.set_xticklabels(names, fontsize=8, rotation=30, ha="right")
        axes.set_ylabel("bytes received per device")
        where = f" in {next(iter(places))}" if len(places) == 1 else ""
        axes.set_title(title or f"{len(self._records)} collectives{where}, "
                       f"{_bytes(self.total_bytes())} per device")
        if dims:
            axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(str(path), dpi=100)

    def __repr__(self) -> str:
        state = "open" if self._open else f"{len(self._records)} collectives"
        return f"<Ledger {state}, {_bytes(self.total_bytes())} per device>"


def _library_dirs() -> Tuple[str, ...]:
    """The folders whose frames are not the user's: TensorFlow, Keras, tf_dtensor and the
    standard library (found without importing them)."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("tensorflow", "keras", "tf_keras"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.abspath(location))
    for key in ("stdlib", "platstdlib"):
        dirs.append(os.path.abspath(sysconfig.get_paths()[key]))
    return tuple(sorted({d.rstrip(os.sep) + os.sep for d in dirs}))


_LIBRARY_DIRS = _library_dirs()


def _user_line() -> str:
    """"file.py:42": the innermost frame of the calling thread outside `_LIBRARY_DIRS`
    (the C++ ledger asks while it records a collective)."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(_LIBRARY_DIRS):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


_core.set_ledger_line_source(_user_line)


def _same_line(recorded: str, wanted: str) -> bool:
    return bool(recorded) and (recorded == wanted or recorded.endswith(os.sep + wanted))


def _op_name(op: str) -> str:
    return {_core.RELAYOUT_OP: "relayout", _core.RELAYOUT_LIKE_OP: "relayout_like"}.get(op, op)


def _function_name(where: str) -> str:
    """"__inference_train_step_123" -> "train_step" (TensorFlow's traced name)."""
    match = re.fullmatch(r"__inference_(.*)_\d+", where)
    return match.group(1) if match else where


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


@contextlib.contextmanager
def collectives() -> Iterator[Ledger]:
    """Records the collectives issued inside the block (see `Ledger`)."""
    ledger = Ledger()
    start = _core.ledger_begin()
    try:
        yield ledger
    finally:
        ledger._records = [_record(r) for r in _core.ledger_end(start)]  # pylint: disable=protected-access
        ledger._open = False  # pylint: disable=protected-access
