#!/usr/bin/env python3
"""bench/results/latest.md: one row per figure, the newest; the rows it replaces go to history.md.

Usage: scripts/bench-results.py LATEST HISTORY --date D --load L --commit C < ROWS
  ROWS: what a bench prints, any text with table rows of six cells
        (| figure | unit | nesinit | peer | peer value | nesinit / peer |); headers, separators and
        other lines are skipped.
  Each row gets three cells more, date (UTC, "YYYY-MM-DD HH:MM"), load (the 1-minute load
  average around the bench: "A-B") and commit (the tree's, "+dirty" when it had changes), and
  replaces in LATEST the row of the same figure: the same key (key()), which the replaced row
  keeps in HISTORY, appended with its own date, load and commit. A figure first measured is
  added after its family's rows (P1, P2, ...). Rows a run does not measure stay as they were.
Both files are rewritten whole (a temp file renamed over each). Prints how many rows it replaced
and added. Run by scripts/bench.sh after each bench.
"""
import argparse
import os
import re
import sys

COLS = ["figure", "unit", "nesinit", "peer", "peer value", "nesinit / peer", "date", "load", "commit"]
HEAD = "| " + " | ".join(COLS) + " |\n|" + "---|" * len(COLS) + "\n"

LATEST_INTRO = """# nesinit bench: the latest figures

One row per figure, the newest measurement of it: `scripts/bench.sh` replaces a figure's row when
it measures it again and moves the row it replaced to [history.md](history.md). Every figure is a
ratio against a peer run in the same invocation, medians; what each row measures and against
what: README "Benchmarks". `date` is UTC, `load` the machine's 1-minute load average during the
run (2 cores), `commit` the tree measured. A figure's own notes (spread, rounds, what changed
since) are in parentheses in its cells.

"""
HISTORY_INTRO = """# nesinit bench: history

Every row bench/results/latest.md no longer shows, oldest first, as it stood when it was replaced
(scripts/bench-results.py appends here). Rows from before 2026-12-07 were measured by hand-run
benches and kept in latest.md as a log; their date, load and commit are read from their own notes
(a `-` where the row named none).

"""


def strip_parens(s):
    """s without its parenthesised groups (nested ones too)."""
    out, depth = [], 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def key(cells):
    """A figure's identity: its figure, peer and unit without the parts a run changes (the
    parenthesised notes, and numbers: a spread, a phase's time), so a new run's row meets the
    row it replaces."""
    def norm(s):
        s = strip_parens(s)
        m = re.match(r"P\d+", s)  # the family's number stays
        head, s = (m.group(0), s[m.end():]) if m else ("", s)
        s = head + re.sub(r"\d+(?:[.,]\d+)*", "#", s)
        s = re.sub(r"\s+([,;:.])", r"\1", s)
        return re.sub(r"\s+", " ", s).strip(" ;,.:")
    return (norm(cells[0]), norm(cells[1]), norm(cells[3]))


def split_row(line):
    """The cells of a markdown table row (an escaped \\| stays in its cell), or None."""
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")) or re.match(r"^\|[-| ]+\|$", line):
        return None
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])]
    if cells and cells[0] == "figure":
        return None
    return cells


def read_rows(path):
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            c = split_row(line)
            if c and len(c) == len(COLS):
                rows.append(c)
    return rows


def family(cells):
    m = re.match(r"P(\d+)", cells[0])
    return int(m.group(1)) if m else 1 << 30


def write(path, intro, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(intro + HEAD)
        for r in rows:
            f.write("| " + " | ".join(r) + " |\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("latest")
    ap.add_argument("history")
    ap.add_argument("--date", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--commit", required=True)
    a = ap.parse_args()
    new = []
    for line in sys.stdin:
        c = split_row(line)
        if c is None:
            continue
        if len(c) != 6:
            print(f"bench-results: a row of {len(c)} cells, not 6: {line.strip()[:120]}", file=sys.stderr)
            return 1
        new.append(c + [a.date, a.load, a.commit])
    latest = read_rows(a.latest)
    history = read_rows(a.history)
    keys = {key(r) for r in new}
    replaced = [r for r in latest if key(r) in keys]
    # Each figure's new row(s) where its old row stood; a new figure after its family's rows.
    out, done = [], set()
    for r in latest:
        k = key(r)
        if k not in keys:
            out.append(r)
        elif k not in done:
            out += [x for x in new if key(x) == k]
            done.add(k)
    for r in new:
        if key(r) in done:
            continue
        fam = [j for j, x in enumerate(out) if family(x) <= family(r)]
        out.insert(fam[-1] + 1 if fam else 0, r)
    write(a.history, HISTORY_INTRO, history + replaced)
    write(a.latest, LATEST_INTRO, out)
    print(f"bench-results: {len(new)} row(s): {len(replaced)} replaced (kept in {a.history}), "
          f"{len(new) - len(replaced)} new", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
