#!/usr/bin/env python3
"""The yardstick of ngsup's pause benchmark: the seed's method, in our words.

The supervisor this project replaces (Python) paused a launch by walking
/proc/<pid>/task/*/children from its own pid, sending SIGSTOP to each process
as it found it, then confirming that each one stopped (state T or t in
/proc/<pid>/stat) or was gone. This is that walk, run from the outside
against a supervisor's pid, so that the benchmark (pkg/reaper/bench_test.go,
BenchmarkSeedWalk*) times it on the very tree it times ngsup on.

    seedwalk.py pause SUPERVISOR_PID STATE_FILE   # stop the tree, record it
    seedwalk.py continue STATE_FILE               # SIGCONT what was recorded

Each prints one JSON line: the processes handled and the milliseconds taken
inside the interpreter (its start is not counted: the seed's supervisor was
already running when it paused). A pause that cannot confirm every process
within 5 s says "paused": false and exits 4.
"""
import json
import os
import signal
import sys
import time


def children(pid):
    """The children of every thread of pid (each thread's file lists only
    the children that thread forked)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def state(pid):
    """The state letter of /proc/PID/stat, None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            line = f.read()
    except OSError:
        return None
    return line[line.rindex(")") + 2]


def pause(sup, budget=5.0):
    """Walk from sup, stopping each process as found; then confirm each,
    for up to budget seconds. Returns the processes and those not stopped."""
    deadline = time.monotonic() + budget
    stopped, queue = [], children(sup)
    while queue:
        pid = queue.pop()
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stopped.append(pid)
        queue.extend(children(pid))
    pending = list(stopped)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if state(p) not in (None, "T", "t", "Z", "X")]
        if pending:
            time.sleep(0.001)
    return stopped, pending


def main(argv):
    begin = time.perf_counter()
    if len(argv) == 4 and argv[1] == "pause":
        procs, pending = pause(int(argv[2]))
        ms = (time.perf_counter() - begin) * 1000  # the seed kept its list in memory
        with open(argv[3], "w") as f:
            f.write("\n".join(map(str, procs)))
        if pending:
            print(json.dumps({"paused": False, "processes": len(procs), "pending": pending[:20]}))
            return 4
    elif len(argv) == 3 and argv[1] == "continue":
        with open(argv[2]) as f:
            procs = [int(p) for p in f.read().split()]
        for pid in procs:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        ms = (time.perf_counter() - begin) * 1000
    else:
        print("usage: seedwalk.py pause SUPERVISOR_PID STATE_FILE | continue STATE_FILE", file=sys.stderr)
        return 2
    print(json.dumps({"processes": len(procs), "elapsed_ms": round(ms, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
