"""Summarise a py-spy raw profile: inclusive and self shares of the non-idle samples.

    python bench/profiles/collapse.py <profile.raw> [--top 40]"""

from __future__ import annotations

import argparse
import re
from collections import Counter

IDLE = ("select (selectors.py", "_run_once", "poll (", "wait (threading.py",
        "_worker (concurrent")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = idle = 0
    with open(args.raw) as fh:
        for line in fh:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")]
            total += n
            if any(k in frames[-1] for k in IDLE) and len(frames) < 12:
                idle += n
                continue
            for f in set(frames):
                inclusive[f] += n
            own[frames[-1]] += n
    busy = max(total - idle, 1)
    print(f"samples {total}, idle {idle}, busy {busy}")
    print("== inclusive (sandboxd), % of busy")
    for name, n in [x for x in inclusive.most_common() if "sandboxd/" in x[0]][:args.top]:
        print(f"{100 * n / busy:5.1f}% {name}")
    print("== self, % of busy")
    for name, n in own.most_common(args.top // 2):
        print(f"{100 * n / busy:5.1f}% {name}")


if __name__ == "__main__":
    main()
