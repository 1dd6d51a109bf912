"""Peak memory of this process, for the benchmarks' spawned children."""
from __future__ import annotations

import resource


def peak_rss_mb() -> float:
    """This process's own peak resident set (MB): Linux's VmHWM, the high-water mark of the process's current
    address space. Not `getrusage().ru_maxrss`: after fork + exec (multiprocessing's "spawn") that also holds the
    parent's resident set at the fork, so a child of a big parent reported the parent's size (bench/README.md, "Big
    gold tables"). Elsewhere (no /proc) ru_maxrss, with that caveat."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
