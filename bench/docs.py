"""The current benchmark figures of docs/benchmarks.md, made from the result files of the runs
that produced them (bench/results/results.json, scale/results.json, scale-3/results.json), so a
figure in the docs cannot drift from its run. Rewrites the part of docs/benchmarks.md between
the `bench-docs` markers; `--check` only compares and exits 1 if the docs differ.

    make bench-docs                       # after `make bench`
    python3 bench/docs.py --check         # are the docs made from the results as they are?

Standard library only. Figures are formatted as qq-bench's own tables (crates/qq-bench/src/
report.rs, whose SCENARIO_NAMES this reads).
"""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/benchmarks.md"
BEGIN = "<!-- bench-docs: begin (made by `make bench-docs` from bench/results; do not edit) -->"
END = "<!-- bench-docs: end -->"
RUNS = [
    ("results.json", "The seven scenarios of `make bench`"),
    ("scale/results.json", "Scale run: scenario 12, 1 000 and 10 000 queues"),
    ("scale-3/results.json", "Scale run: scenario 3 with 1 000 active queues"),
]


def scenario_names():
    src = (ROOT / "crates/qq-bench/src/report.rs").read_text()
    body = re.search(r"SCENARIO_NAMES: \[&str; \d+\] = \[(.*?)\];", src, re.S).group(1)
    return re.findall(r'"([^"]*)"', body)


def value(v, unit):
    if v is None:
        return "n/a"
    if unit in ("msg/s", "msgs", "MiB") or v >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def target(t):
    if not t:
        return ""
    met = {True: "met", False: "MISSED", None: "(not measured)"}[t.get("met")]
    return f"{t['text']} {met}"


def table(run, names):
    out = [f"Run started {run['started']}, scenarios {', '.join(map(str, run['scenarios']))}.", "",
           "| scenario | figure | quorumq | RabbitMQ | qq/rabbit | target |",
           "|---|---|---:|---:|---:|---|"]
    for r in run["rows"]:
        n = r["scenario"]
        name = names[n - 1] if 0 < n <= len(names) else "?"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
        out.append(f"| {n} {name} | {r['name']} ({r['unit']}) | {value(r.get('quorumq'), r['unit'])} "
                   f"| {value(r.get('rabbitmq'), r['unit'])} | {ratio} | {target(r.get('target'))} |")
    return out


def generated():
    names = scenario_names()
    out = [BEGIN]
    for path, title in RUNS:
        f = ROOT / "bench/results" / path
        out += ["", f"### {title}", "", f"From [`bench/results/{path}`](../bench/results/{path}).", ""]
        out += table(json.loads(f.read_text()), names)
    return "\n".join(out + ["", END])


def main(argv):
    doc = DOC.read_text()
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < 0:
        sys.exit(f"{DOC}: no bench-docs markers")
    new = doc[:start] + generated() + doc[end + len(END):]
    if "--check" in argv:
        if new != doc:
            print(f"{DOC.relative_to(ROOT)} differs from bench/results: run `make bench-docs`", file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)}: figures match bench/results")
        return 0
    DOC.write_text(new)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
