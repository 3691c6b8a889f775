#!/usr/bin/env python3
"""Copies the tables of bench/results.md into README.md's Performance section.

The README keeps its own prose; only the part between the line starting with "Latest run:" and
the line "How to read it:" is replaced: each "### Section" of the results becomes a bold
heading followed by that section's tables and goal lines ("#### Sub-section" headings as
italic lines).
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
results = (root / "bench" / "results.md").read_text()
# The section `make bench-peers` keeps at the end of the file is not make bench's: left out.
results = results.split("<!-- bench-peers: begin", 1)[0]
readme_path = root / "bench" / "README.md"
readme = readme_path.read_text()

header = re.search(r"^(Redis \S+) on \d+ cores.*?; (\d+) s in all", results, re.M)
parts = []
if header:
    parts.append(f"Latest run: {header.group(1)}, a noisy 2-core VM, {header.group(2)} s in all.\n")
for section in re.split(r"^### ", results, flags=re.M)[1:]:
    title, _, body = section.partition("\n")
    # Tables and goal lines are kept; a "#### Sub-section" heading becomes an italic line, and
    # anything else between two tables leaves a blank line, so they stay two tables.
    kept = []
    for line in body.splitlines():
        if line.startswith("|") or line.startswith("Goal"):
            kept.append(line)
        elif line.startswith("#### "):
            kept += ["", f"*{line[5:].strip()}*", ""]
        elif kept and kept[-1] != "":
            kept.append("")
    while kept and kept[-1] == "":
        kept.pop()
    if kept:
        parts.append(f"**{title.strip()}**\n\n" + "\n".join(kept) + "\n")

start = readme.index("Latest run:")
end = readme.index("How to read it:")
new = readme[:start] + "\n".join(parts) + "\n" + readme[end:]
if new != readme:
    readme_path.write_text(new)
    print("README.md: Performance tables updated from bench/results.md")
sys.exit(0)
