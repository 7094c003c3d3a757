"""How much CPU time other processes took while this one measured."""
import os
import time

#: Other processes' load, in cores, above which timings are reported as unreliable.
BUSY = 0.25


class CpuMeter:
    """CPU time other processes used while a measurement ran, in cores
    (from /proc/stat less this process's own time); None where unreadable."""

    def __init__(self):
        self.start = self._snap()

    @staticmethod
    def _snap():
        try:
            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        t = os.times()
        busy = (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")
        return time.monotonic(), busy, t[0] + t[1]

    def others(self):
        end = self._snap()
        if self.start is None or end is None:
            return None
        wall = end[0] - self.start[0]
        if wall <= 0:
            return None
        return max(0.0, ((end[1] - self.start[1]) - (end[2] - self.start[2])) / wall)
