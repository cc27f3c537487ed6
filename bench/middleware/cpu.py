"""CPU time so far, for bench/middleware.sh: prints one JSON object with the
clock ticks (user + system, all threads) of the server process, of the
cluster (the postmaster and all its children: the pool's backends, the WAL
writer, the checkpointer, ...), and of the whole machine (busy and total,
from /proc/stat; the difference of two snapshots minus the parts above and
the load client's own is what other programs used meanwhile).

    python3 cpu.py SERVER_PID POSTMASTER_PID
"""

from __future__ import annotations

import json
import os
import sys


def ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def children(parent: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent:
            out.append(int(name))
    return out


def main() -> None:
    server, postmaster = int(sys.argv[1]), int(sys.argv[2])
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]  # idle, iowait
    print(json.dumps({
        "hz": os.sysconf("SC_CLK_TCK"),
        "server": ticks(server),
        "postgres": ticks(postmaster) + sum(ticks(p) for p in children(postmaster)),
        "machine_busy": sum(cpu[:8]) - idle,
        "machine_total": sum(cpu[:8]),
    }))


if __name__ == "__main__":
    main()
