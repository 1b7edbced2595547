"""Writing a benchmark's JSON: its figures plus the machine they were measured on.

Why one place: the figures of these machines are noisy, so every result file records the same
facts about where and under what load it was measured (Python, platform, CPUs, 1-minute load
average), and a reader comparing two files finds them under the same keys.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any


def write_json(path: Path, benchmark: str, results: dict[str, Any]) -> None:
    """Write ``results`` with the benchmark's name and the machine's facts to ``path``."""
    out = {
        **results,
        "benchmark": benchmark,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
