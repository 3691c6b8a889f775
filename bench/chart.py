"""Draws bench/handoff.png: handoff latency of the four waiting strategies (the contention rows
of `make bench`) as cumulative distributions on a log scale, with the PING round trip of the
same run. Input: target/bench/handoff.csv (series,handoff_us), written by the bench.

Usage: python3 bench/chart.py target/bench/handoff.csv bench/handoff.png
"""

import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

SERIES = [
    ("wait", "LOCK.ACQUIRE ... WAIT (server-side queue)", "#1b9e77"),
    ("pubsub", "(b) SET NX + pub/sub wake-up (Redisson)", "#7570b3"),
    ("spin5", "(c) SET NX + 5 ms spinning", "#d95f02"),
    ("poll100", "(a) SET NX + 100 ms polling (redis-py)", "#e7298a"),
]


def percentile(sorted_values, p):
    at = round((len(sorted_values) - 1) * p)
    return sorted_values[at]


def fmt_us(us):
    if us >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} µs"


def main(src, dst):
    data = defaultdict(list)
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            data[row["series"]].append(float(row["handoff_us"]))
    for values in data.values():
        values.sort()

    fig, ax = plt.subplots(figsize=(10, 6.4), dpi=150)
    for key, label, color in SERIES:
        values = data.get(key)
        if not values:
            continue
        n = len(values)
        ys = [(i + 1) / n * 100 for i in range(n)]
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        ax.step(
            values,
            ys,
            where="post",
            color=color,
            linewidth=2.2,
            label=f"{label}: p50 {fmt_us(p50)}, p99 {fmt_us(p99)}",
        )
        ax.plot([p50], [50], "o", color=color, markersize=6)
    if data.get("ping"):
        rtt = percentile(data["ping"], 0.5)
        ax.axvline(rtt, color="#444444", linestyle=":", linewidth=1.4)
        ax.text(
            rtt * 0.93,
            88,
            f"PING round trip\np50 {fmt_us(rtt)}",
            ha="right",
            va="center",
            fontsize=9,
            color="#444444",
        )
        ax.axvline(rtt + 50, color="#1b9e77", linestyle="--", linewidth=1.2, alpha=0.8)
        ax.text(
            rtt * 0.93,
            70,
            "dashed: goal for\nWAIT's p50, round\ntrip + 50 µs",
            ha="right",
            va="center",
            fontsize=9,
            color="#1b9e77",
        )
        lo = min(min(v) for v in data.values() if v)
        # The right edge: the slowest series' 99.9th percentile (its last few handoffs run off).
        hi = max(percentile(v, 0.999) for v in data.values() if v)
        ax.set_xlim(left=min(lo, rtt) / 3.5, right=hi * 1.3)

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_us(v)))
    ax.set_ylim(0, 101)
    ax.set_ylabel("handoffs completed within x (%)")
    ax.set_xlabel("handoff latency: release sent → next holder reads its grant (log scale)")
    ax.set_title(
        "Lock handoff between 16 clients contending for one lock\n"
        "(make bench: every handoff of every round; the server and the clients on their own cores)",
        fontsize=12,
    )
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="x", alpha=0.12)
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=2,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(dst)
    print(f"chart: wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
