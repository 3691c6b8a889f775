#!/usr/bin/env python3
"""The conformance table as markdown, one column per helper, from what the runners recorded.

    rm -f /tmp/conformance && CONFORMANCE_RESULTS=/tmp/conformance make test-clients
    python3 clients/conformance/table.py /tmp/conformance

Each runner appends `helper<TAB>case<TAB>pass|skip|fail` per case to $CONFORMANCE_RESULTS. Cases
come in cases.json's order; a case a helper did not report shows as "not run".
"""

import json
import sys
from pathlib import Path

HELPERS = ("python", "rust", "node")
TITLES = {"python": "Python", "rust": "Rust", "node": "Node.js"}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    cases = json.loads((Path(__file__).with_name("cases.json")).read_text())["cases"]
    results: dict = {}
    for line in Path(sys.argv[1]).read_text().splitlines():
        helper, case, result = line.split("\t")
        results[(helper, case)] = result
    print("| case | " + " | ".join(TITLES[h] for h in HELPERS) + " |")
    print("|---|" + "---|" * len(HELPERS))
    for case in cases:
        name = case["name"]
        cells = [results.get((helper, name), "not run") for helper in HELPERS]
        print(f"| `{name}` | " + " | ".join(cells) + " |")
    failed = [key for key, result in results.items() if result != "pass" and result != "skip"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
