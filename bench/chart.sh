#!/usr/bin/env bash
# Draws bench/handoff.png from the handoff samples of the last full `make bench`
# (target/bench/handoff.csv) with matplotlib, which it installs with pip into .cache/bench-py
# the first time. Without python3, pip or PyPI it says so and leaves the committed PNG alone:
# the chart is a bonus, never a reason for `make bench` to fail.
set -uo pipefail

MATPLOTLIB_VERSION=3.9.4

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="$root/target/bench/handoff.csv"
out="$root/bench/handoff.png"
pylib="$root/.cache/bench-py"
stamp="$pylib/matplotlib-$MATPLOTLIB_VERSION.dist-info"

say() { echo "chart: $*" >&2; }

if [[ -n ${BENCH_QUICK:-} && ${BENCH_QUICK} != 0 ]]; then
    say "BENCH_QUICK: not redrawing $out"
    exit 0
fi
[[ -f $data ]] || { say "no $data (run the contention section first)"; exit 0; }
command -v python3 >/dev/null 2>&1 || { say "python3 not found; $out not redrawn"; exit 0; }

if [[ ! -d $stamp ]]; then
    say "installing matplotlib==$MATPLOTLIB_VERSION with pip into $pylib"
    tmp="$(mktemp -d "$root/.cache/bench-py.tmp.XXXXXX")" || exit 0
    if PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --no-warn-conflicts --only-binary=:all: --target "$tmp" \
        "matplotlib==$MATPLOTLIB_VERSION" >&2; then
        rm -rf "$pylib"
        mv "$tmp" "$pylib"
    else
        rm -rf "$tmp"
        say "pip install matplotlib failed; $out not redrawn"
        exit 0
    fi
fi

PYTHONPATH="$pylib" MPLCONFIGDIR="$root/.cache/bench-py-config" \
    python3 "$root/bench/chart.py" "$data" "$out" \
    || say "drawing failed; $out not redrawn"
