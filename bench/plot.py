"""Redraw the benchmark charts from the recorded results, without running any benchmark.

    python bench/plot.py              # every suite recorded in bench/results/
    python bench/plot.py gguf cli     # these suites only

Each suite records its medians in bench/results/<suite>.json when it publishes (see
`common.publish`); this draws docs/img/<suite>.png from them (needs matplotlib: the bench extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import IMAGES, RECORDS, chart  # noqa: E402


def main(suites: list[str]) -> int:
    files = [RECORDS / f"{s}.json" for s in suites] if suites else sorted(RECORDS.glob("*.json"))
    missing = [f.name for f in files if not f.exists()]
    if missing or not files:
        print(f"no recorded results: {', '.join(missing) or RECORDS}", file=sys.stderr)
        return 1
    for file in files:
        record = json.loads(file.read_text())
        out = chart(record, IMAGES / f"{record['suite']}.png")
        print(f"{out.relative_to(IMAGES.parent.parent)}: {out.stat().st_size / 1024:.0f} KiB from {file.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
