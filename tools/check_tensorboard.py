#!/usr/bin/env python3
"""Checks a tessera run's TensorBoard files against its metrics.jsonl, with TensorBoard's own
reader (EventAccumulator over RUN_DIR/tb, every event file in order, as TensorBoard shows them).

The rule tessera writes by (src/tessera/train/tensorboard.hpp): every number of a metrics row but
"step" and "time" is a scalar tagged "<event>/<key>" ("train" for step rows), at the row's step,
or for rows without one at the last step written before them (0 before the first). A resumed
run's new file starts with a START event that makes the reader drop what the earlier file held
after the checkpoint, as metrics.jsonl drops those rows. So for every tag TensorBoard must show
exactly the points of metrics.jsonl: the same steps in the same order, the values equal as
float32 (TensorBoard's simple_value), and the wall time of each point the row's "time".

Usage: .venv-oracle/bin/python tools/check_tensorboard.py RUN_DIR
(scripts/setup --with-oracle installs tools/requirements-tensorboard.txt into .venv-oracle.)
Exit status 0: they agree; 1: a difference (each printed); 2: bad input.
"""
import json
import os
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator


def expected_points(rows):
    """tag -> [(step, float32 value, time)] in file order, by tessera's rule."""
    points = {}
    step = 0
    for row in rows:
        if isinstance(row.get("step"), int):
            step = row["step"]
        group = row.get("event", "step")
        group = "train" if group == "step" else group
        for key, value in row.items():
            if key in ("step", "time") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                points.setdefault(f"{group}/{key}", []).append(
                    (step, np.float32(value), row["time"]))
    return points


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    complete = text[: text.rfind("\n") + 1]  # a row cut by a kill is not a row
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    run = argv[1]
    metrics, tb = os.path.join(run, "metrics.jsonl"), os.path.join(run, "tb")
    if not os.path.isfile(metrics) or not os.path.isdir(tb):
        print(f"error: {run} has no metrics.jsonl and tb/ (hint: give a tessera train run folder)",
              file=sys.stderr)
        return 2
    rows = read_rows(metrics)
    problems = [f"row {i + 1} has no event or time: {row}" for i, row in enumerate(rows)
                if "event" not in row or not isinstance(row.get("time"), float)]
    if problems:
        print("\n".join(problems))
        return 1
    want = expected_points(rows)
    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got_tags = set(acc.Tags()["scalars"])
    for tag in sorted(set(want) - got_tags):
        problems.append(f"{tag}: in metrics.jsonl ({len(want[tag])} points), not in tb/")
    for tag in sorted(got_tags - set(want)):
        problems.append(f"{tag}: in tb/, not in metrics.jsonl")
    points = 0
    for tag in sorted(set(want) & got_tags):
        got = acc.Scalars(tag)
        if len(got) != len(want[tag]):
            problems.append(f"{tag}: {len(got)} points in tb/, {len(want[tag])} in metrics.jsonl")
            continue
        for g, (step, value, time) in zip(got, want[tag]):
            if g.step != step or np.float32(g.value) != value or abs(g.wall_time - time) > 1e-6:
                problems.append(f"{tag}: tb/ has step {g.step} value {g.value} time {g.wall_time}, "
                                f"metrics.jsonl step {step} value {value} time {time}")
        points += len(got)
    if problems:
        print("\n".join(problems))
        return 1
    files = sorted(f for f in os.listdir(tb) if "tfevents" in f)
    print(f"ok: {len(want)} tags, {points} points in {len(files)} event file(s) equal "
          f"metrics.jsonl's {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
