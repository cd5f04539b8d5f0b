"""Sum a PARALAB_TEST_CPU_REPORT file (tests/conftest.py) by module: CPU seconds (the pytest
process and every child it reaped) and wall seconds, the most expensive first.

    python scripts/test_cpu.py test-artifacts/test-cpu.jsonl [--top 30]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    with open(args.report) as f:
        for line in f:
            r = json.loads(line)
            mod = r["test"].split("::", 1)[0]
            cpu[mod] += r["cpu_s"]
            wall[mod] += r["wall_s"]
            tests[mod] += 1
    total = sum(cpu.values())
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>5}  module")
    for mod in sorted(cpu, key=cpu.get, reverse=True)[:args.top]:
        print(f"{cpu[mod]:8.1f} {100 * cpu[mod] / total:5.1f}% {wall[mod]:8.1f} "
              f"{tests[mod]:5d}  {mod}")
    print(f"{total:8.1f} CPU s in {sum(tests.values())} tests "
          f"({total / 60:.1f} CPU-min)")


if __name__ == "__main__":
    main()
