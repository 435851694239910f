"""The CPU the whole machine has spent so far (/proc/stat: user, nice, system), in seconds:
what the benchmarks that run work in other processes (Ray's workers, pytest's) compare.
Linux only."""
from __future__ import annotations

import os


def machine_cpu_s() -> float:
    fields = open("/proc/stat").readline().split()[1:4]
    return sum(map(int, fields)) / os.sysconf("SC_CLK_TCK")
