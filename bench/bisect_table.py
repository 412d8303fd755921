#!/usr/bin/env python3
"""The table of a performance bisection (bench/bisect.sh): per commit, every round's scenario 1
throughput and scenario 2 p99s, their medians, and the median throughput's ratio to the first
commit's.

    python3 bench/bisect_table.py OUT_DIR COMMIT...   (writes OUT_DIR/table.md and prints it)
"""

import json
import statistics
import sys
from pathlib import Path


def figure(outcome, name):
    for f in outcome.get("figures", []):
        if f.get("name") == name and f.get("value") is not None:
            return f["value"]
    return None


def p99(outcome, kind):
    for lat in outcome.get("latencies", []):
        if lat.get("kind") == kind:
            for p, v in lat.get("percentiles", []):
                if p == 99.0:
                    return v
    return None


def rounds(out, commit):
    """(throughput msg/s, confirm p99 ms, deliver p99 ms) of each round that has results."""
    rows = []
    for run in sorted((out / commit).glob("round*/results.json")):
        qq = json.loads(run.read_text()).get("outcomes", {}).get("quorumq", {})
        s1, s2 = qq.get("1", {}), qq.get("2", {})
        rows.append(
            (
                figure(s1, "delivered+acked"),
                p99(s2, "publish\u2192confirm"),
                p99(s2, "publish\u2192deliver"),
            )
        )
    return rows


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    return "-" if v is None else f"{v:,.{digits}f}".replace(",", " ")


def main():
    out = Path(sys.argv[1])
    commits = sys.argv[2:]
    lines = [
        "| commit | date | subject | scenario 1 msg/s (runs) | median | ratio to first "
        "| confirm p99 ms (runs) | deliver p99 ms (runs) |",
        "|---|---|---|---|---:|---:|---|---|",
    ]
    first = None
    for c in commits:
        meta = (out / c / "commit").read_text().split(" ", 2) if (out / c / "commit").exists() else []
        sha = meta[0][:7] if meta else c
        date = meta[1][:16].replace("T", " ") if len(meta) > 1 else ""
        subject = meta[2].strip()[:60] if len(meta) > 2 else ""
        rows = rounds(out, c)
        tput = [r[0] for r in rows]
        m = med(tput)
        if first is None:
            first = m
        ratio = f"{m / first:.2f}" if m and first else "-"
        lines.append(
            f"| {sha} | {date} | {subject} | {' / '.join(fmt(t) for t in tput)} | {fmt(m)} "
            f"| {ratio} | {' / '.join(fmt(r[1], 1) for r in rows)} "
            f"| {' / '.join(fmt(r[2], 1) for r in rows)} |"
        )
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
