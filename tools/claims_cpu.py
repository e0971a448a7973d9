"""Keep the claims of `bash reproduce.sh cpu` in tests/claims_cpu.txt, row by row, across sessions.

The reproduction runs in pieces (a row here, two rows there, each in its own output folder), so this replaces the
blocks of the rows that OUT holds with `python report.py --claims OUT`'s, and keeps every other row's block as it
was. The README's claims table quotes these numbers; tests/test_reproduce.py checks that it does.

    python tools/claims_cpu.py out                     # after bash reproduce.sh cpu --only ROW[,ROW] --out out
    python tools/claims_cpu.py out --check             # say which rows would change, write nothing
    python tools/claims_cpu.py out --compare           # how far each number moved, in standard errors; write nothing
    python tools/claims_cpu.py out --compare --against 39ea343^   # against the claims stored at that commit
    python tools/claims_cpu.py out --rows converged,mechanism   # those rows alone (OUT holds others' runs too)

--compare pairs every "mean +- s.e." of OUT's rows with the stored one of the same block, line and key, and counts
those within 1 and 2 combined standard errors (sqrt(s1^2 + s2^2)), listing the ones beyond 2 and every other number
that changed. Runs of the same seeds are correlated, so this is a conservative test of "within its standard error".
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = re.compile(r"\[(\w+)\] ")  # a row's block starts "[row] merged/folder (...)"
FILE = os.path.join(ROOT, "tests", "claims_cpu.txt")


def blocks(text):
    """(notes, {row: [lines]}) of a claims text: '#' lines are notes; a row's block runs to the next header."""
    notes, out, row = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            notes.append(line)
            continue
        if m := HEADER.match(line):
            row = m[1]
            if line.endswith(": not run"):  # report.py's line for a row whose folder is missing
                row = None
                continue
        if row is not None:
            out.setdefault(row, []).append(line)
    return notes, out


PAIR = re.compile(r"^(.*?)\s*([-+]?\d+(?:\.\d+)?) \+- (\d+(?:\.\d+)?)")  # "patch:0.1 -0.0027 +- 0.0005 (3 seeds)"


def numbers(lines):
    """{(block header, line label, key): (mean, s.e.) or the segment's text} of a row's claims lines: a line is
    'label | key value +- s.e. | ...'; a segment without a standard error is kept as text, compared as it is. Where
    a block has several lines of one label (datascale's '3000 images | mlp - vit | ...'), the label takes the line's
    first segment too, so that no line's numbers stand in for another's."""
    out, blocks = {}, [("", [])]
    for line in lines:
        if HEADER.match(line):  # the merged folder names the block: a row may have several
            blocks.append((line.split(" ", 1)[1].split(" (")[0], []))
        else:
            blocks[-1][1].append(line)
    for header, block in blocks:
        labels = [line.split(" | ")[0] for line in block]
        for line in block:
            label, *segments = line.split(" | ")
            if labels.count(label) > 1 and segments:
                label += " | " + segments[0]
            for i, seg in enumerate(segments):
                if m := PAIR.match(seg):
                    out[header, label, m[1] or str(i)] = (float(m[2]), float(m[3]))
                else:
                    out[header, label, str(i)] = seg
    return out


def stored(rev=None):
    """The stored claims text: tests/claims_cpu.txt as it is, or as it was at git revision rev (an older run's)."""
    if rev is None:
        return open(FILE).read() if os.path.exists(FILE) else ""
    path = os.path.relpath(FILE, ROOT).replace(os.sep, "/")  # git's name of the file
    got = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if got.returncode:
        sys.exit(f"claims_cpu.py: --against {rev}: no {path} there ({got.stderr.strip()})")
    return got.stdout


def rows_of(claims):
    """The rows of a claims text, in its order (report.py's)."""
    return list(dict.fromkeys(m[1] for line in claims.splitlines() if (m := HEADER.match(line))))


def compare(old, new):
    """(pairs, identical, within 1 s.e., within 2, [lines beyond 2], [other changes], new numbers) of a row's stored
    and fresh claims lines."""
    before, after = numbers(old), numbers(new)
    n = same = one = two = 0
    far, changed = [], []
    for k, v in after.items():
        was = before.get(k)
        name = " | ".join(x for x in k if x)
        if isinstance(v, tuple) and isinstance(was, tuple):
            n += 1
            se = (was[1] ** 2 + v[1] ** 2) ** 0.5
            z = abs(v[0] - was[0]) / se if se else (0.0 if v[0] == was[0] else float("inf"))
            same, one, two = same + (v == was), one + (z <= 1), two + (z <= 2)
            if z > 2:
                far.append(f"{name}: {was[0]:g} +- {was[1]:g} -> {v[0]:g} +- {v[1]:g} (z = {z:.1f})")
        elif was is not None and v != was:
            changed.append(f"{name}: {was} -> {v}")
    added = sum(k not in before for k in after)  # lines that an older report.py did not print
    present = {k[0] for k in after}  # a block that OUT lacks (a merge not made) is one line, not each of its numbers
    changed += [f"{' | '.join(x for x in k if x)}: {was} -> gone" for k, was in before.items()
                if k not in after and k[0] in present]
    changed += [f"{h}: not in OUT" for h in dict.fromkeys(k[0] for k in before) if h not in present]
    return n, same, one, two, far, changed, added


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the output folder of bash reproduce.sh cpu (--out)")
    p.add_argument("--check", action="store_true", help="print the rows that would change; write nothing")
    p.add_argument("--compare", action="store_true", help="print how far each number moved from the stored one, in "
                   "combined standard errors; write nothing")
    p.add_argument("--against", metavar="REV", help="with --check or --compare: the claims stored at git revision REV "
                   "(an older run's, e.g. the commit before a rerun replaced them) in place of today's")
    p.add_argument("--rows", type=lambda s: s.split(","), default=None, help="ROW[,ROW]: these rows alone, every "
                   "other row's block kept as stored (default: every row that OUT holds)")
    args = p.parse_args()
    if args.against is not None and not (args.check or args.compare):
        sys.exit("claims_cpu.py: --against reads older claims; use it with --check or --compare (it writes nothing)")
    got = subprocess.run([sys.executable, os.path.join(ROOT, "report.py"), "--claims", os.path.abspath(args.out)],
                         cwd=ROOT, capture_output=True, text=True)  # OUT from the user's folder
    if got.returncode:  # report.py's own line: no such folder, a corrupt metrics.json
        sys.exit(f"claims_cpu.py: {got.stderr.strip()}")
    fresh = got.stdout
    notes, kept = blocks(stored(args.against))
    _, new = blocks(fresh)
    rows = rows_of(fresh)
    if args.rows is not None:
        if unknown := [r for r in args.rows if r not in rows]:
            sys.exit(f"claims_cpu.py: no row {', '.join(unknown)} (rows: {', '.join(rows)})")
        new = {r: lines for r, lines in new.items() if r in args.rows}
    changed = [r for r in new if new[r] != kept.get(r)]
    print("rows from", args.out + ":", ", ".join(new) or "none", "| changed:", ", ".join(changed) or "none")
    if args.compare:
        for r in new:
            if r not in kept:
                print(f"[{r}] not stored yet")
                continue
            n, same, one, two, far, other, added = compare(kept[r], new[r])
            print(f"[{r}] {n} numbers with a standard error: {same} as stored, {one} within 1 s.e., {two} within 2; "
                  f"{len(other)} other changes" + (f"; {added} numbers not stored" if added else ""))
            print("".join(f"  {line}\n" for line in far + other), end="")
    if args.check or args.compare:
        return
    kept.update(new)
    body = [line for r in rows if r in kept for line in kept[r]]
    with open(FILE + ".tmp", "w") as f:
        f.write("\n".join(notes + body) + "\n")
    os.replace(FILE + ".tmp", FILE)
    print("wrote", FILE)


if __name__ == "__main__":
    main()
