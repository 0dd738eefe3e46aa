"""Thread-safe request metrics for the retrieval service, rendered in Prometheus' text exposition format.

Counters ``ce_requests_total{path,status}``, a latency histogram ``ce_request_seconds{path}`` (cumulative
buckets, ``_sum`` and ``_count`` as Prometheus expects), and gauges set by the service (served version,
gallery size, in-flight requests, reloads). No client library is needed: the format is plain text.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(**kw) -> str:
    inner = ",".join(
        f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in kw.items()
    )
    return "{" + inner + "}" if inner else ""


class Metrics:
    def __init__(self, buckets=LATENCY_BUCKETS):
        self._lock = threading.Lock()
        self.buckets = tuple(buckets)
        self._requests: dict[tuple[str, int], int] = defaultdict(int)
        self._hist: dict[str, list[int]] = {}
        self._sum: dict[str, float] = defaultdict(float)
        self._gauges: dict[str, float] = {}
        self._counters: dict[str, float] = defaultdict(float)

    def observe(self, path: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(path, int(status))] += 1
            counts = self._hist.setdefault(path, [0] * (len(self.buckets) + 1))
            counts[bisect.bisect_left(self.buckets, seconds)] += 1
            self._sum[path] += seconds

    def inc(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self._counters[name] += value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = float(value)

    def add(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = self._gauges.get(name, 0.0) + value

    def requests(self, path: str | None = None, status: int | None = None) -> int:
        with self._lock:
            return sum(
                c
                for (p, s), c in self._requests.items()
                if (path is None or p == path) and (status is None or s == status)
            )

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP ce_requests_total HTTP requests by path and status code.",
                "# TYPE ce_requests_total counter",
            ]
            for (path, status), count in sorted(self._requests.items()):
                lines.append(f"ce_requests_total{_labels(path=path, status=status)} {count}")
            lines += ["# HELP ce_request_seconds Request latency in seconds.", "# TYPE ce_request_seconds histogram"]
            for path, counts in sorted(self._hist.items()):
                running = 0
                for bound, c in zip(self.buckets, counts[:-1], strict=True):
                    running += c
                    lines.append(f"ce_request_seconds_bucket{_labels(path=path, le=format(bound, 'g'))} {running}")
                running += counts[-1]
                lines.append(f"ce_request_seconds_bucket{_labels(path=path, le='+Inf')} {running}")
                lines.append(f"ce_request_seconds_sum{_labels(path=path)} {self._sum[path]:.6f}")
                lines.append(f"ce_request_seconds_count{_labels(path=path)} {running}")
            for name, value in sorted(self._counters.items()):
                lines += [f"# TYPE {name} counter", f"{name} {value:g}"]
            for name, value in sorted(self._gauges.items()):
                lines += [f"# TYPE {name} gauge", f"{name} {value:g}"]
            return "\n".join(lines) + "\n"
