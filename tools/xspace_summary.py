"""Summarizes TensorFlow profiler traces (`*.xplane.pb`, as `tf.profiler.experimental`
writes them) as text: per plane (host, each GPU) and per line (thread, stream), how many
events ran and how long they took, and the events that took most time. Used to read the
GPU traces of bench/gpu.py (`--profile DIR`) where no TensorBoard runs.

    python tools/xspace_summary.py DIR [--steps 5] [--top 12]

Counts and times are divided by --steps (the bench profiles 5 training steps), so they read
as per step.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
from typing import Dict, List


def _xplane_pb2():
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # older layouts of the TensorFlow wheel
        from tsl.profiler.protobuf import xplane_pb2  # type: ignore
    return xplane_pb2


def summarize(path: str, steps: int, top: int, out=sys.stdout) -> None:
    space = _xplane_pb2().XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    print(f"== {path}", file=out)
    for plane in space.planes:
        names = {k: m.name or m.display_name for k, m in plane.event_metadata.items()}
        events = sum(len(line.events) for line in plane.lines)
        if not events:
            continue
        print(f"-- plane {plane.name}: {events / steps:.0f} events per step", file=out)
        by_name: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
        lines = sorted((line for line in plane.lines if line.events),
                       key=lambda line: -sum(e.duration_ps for e in line.events))
        for shown, line in enumerate(lines):
            for e in line.events:
                slot = by_name[names.get(e.metadata_id, str(e.metadata_id))]
                slot[0] += 1
                slot[1] += e.duration_ps
            if shown >= top:  # counted above, not listed
                continue
            busy = sum(e.duration_ps for e in line.events)
            first = min(e.offset_ps for e in line.events)
            last = max(e.offset_ps + e.duration_ps for e in line.events)
            print(f"   line {line.name or line.display_name or line.id!s:40.40s} "
                  f"{len(line.events) / steps:7.0f} ev/step  busy {busy / 1e6 / steps:9.1f} us/step"
                  f"  span {(last - first) / 1e6:9.1f} us", file=out)
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
        for name, (count, ps) in ranked:
            print(f"      {count / steps:7.1f} x {ps / 1e6 / max(count, 1):8.2f} us = "
                  f"{ps / 1e6 / steps:9.1f} us/step  {name[:90]}", file=out)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.dir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        sys.exit(f"no *.xplane.pb under {args.dir}")
    for path in paths:
        summarize(path, args.steps, args.top)


if __name__ == "__main__":
    main()
