"""Keep the claims of `bash reproduce.sh cpu` in tests/claims_cpu.txt, row by row, across sessions.

The reproduction runs in pieces (a row here, two rows there, each in its own output folder), so this replaces the
blocks of the rows that OUT holds with `python report.py --claims OUT`'s, and keeps every other row's block as it
was. The README's claims table quotes these numbers; tests/test_reproduce.py checks that it does.

    python tools/claims_cpu.py out                     # after bash reproduce.sh cpu --only ROW[,ROW] --out out
    python tools/claims_cpu.py out --check             # say which rows would change, write nothing
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE = os.path.join(ROOT, "tests", "claims_cpu.txt")


def blocks(text):
    """(notes, {row: [lines]}) of a claims text: '#' lines are notes; a row's block runs to the next header."""
    notes, out, row = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            notes.append(line)
            continue
        if m := re.match(r"\[(\w+)\] ", line):
            row = m[1]
            if line.endswith(": not run"):  # report.py's line for a row whose folder is missing
                row = None
                continue
        if row is not None:
            out.setdefault(row, []).append(line)
    return notes, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the output folder of bash reproduce.sh cpu (--out)")
    p.add_argument("--check", action="store_true", help="print the rows that would change; write nothing")
    args = p.parse_args()
    fresh = subprocess.run([sys.executable, os.path.join(ROOT, "report.py"), "--claims", args.out], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    notes, kept = blocks(open(FILE).read()) if os.path.exists(FILE) else ([], {})
    _, new = blocks(fresh)
    rows = list(dict.fromkeys(m[1] for m in re.finditer(r"^\[(\w+)\] ", fresh, re.M)))  # report.py's order
    changed = [r for r in new if new[r] != kept.get(r)]
    print("rows from", args.out + ":", ", ".join(new) or "none", "| changed:", ", ".join(changed) or "none")
    if args.check:
        return
    kept.update(new)
    body = [line for r in rows if r in kept for line in kept[r]]
    with open(FILE + ".tmp", "w") as f:
        f.write("\n".join(notes + body) + "\n")
    os.replace(FILE + ".tmp", FILE)
    print("wrote", FILE)


if __name__ == "__main__":
    main()
