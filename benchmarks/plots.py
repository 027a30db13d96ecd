"""PNG figures for ``python -m benchmarks compare`` (matplotlib, Agg backend).

``python -m benchmarks.plots [JSON]`` (or ``python -m benchmarks compare --from-json JSON``) redraws them from a saved run
(default ``benchmarks/out/compare.json``) into ``benchmarks/figures/``:

- ``compare-bytes.png``: bytes on disk per session vs session length, log-log;
- ``compare-load-head.png``: time to load the head state vs session length, log-log;
- ``compare-append.png``: append throughput, one event and one turn per transaction;
- ``compare-concurrency.png``: throughput and p99 latency vs concurrent writers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

HERE = Path(__file__).resolve().parent

# One fixed style per target, so every figure reads the same way.
STYLE: dict[str, dict[str, Any]] = {
    "raw": {"color": "#555555", "marker": "o", "linestyle": "--"},
    "es-pg": {"color": "#d62728", "marker": "o", "linewidth": 2.6},
    "es-sqlite": {"color": "#ff7f0e", "marker": "s", "linewidth": 2.2},
    "lg-event": {"color": "#1f77b4", "marker": "^"},
    "lg-turn": {"color": "#17becf", "marker": "v"},
    "lg-delta": {"color": "#9467bd", "marker": "D"},
    "esrc": {"color": "#2ca02c", "marker": "P"},
    "esrc-snap": {"color": "#8c564b", "marker": "X"},
}


def _series(data: dict[str, Any], metric: str) -> list[tuple[str, str, list[float], list[float]]]:
    out = []
    for key, e in data["targets"].items():
        xs, ys = [], []
        for t, r in sorted(e.get("sizes", {}).items(), key=lambda kv: int(kv[0])):
            if "error" in r or "skipped" in r or r.get(metric) is None:
                continue
            xs.append(r["events"])
            ys.append(r[metric])
        if xs:
            label = e["label"] + ("" if all(r.get("ok", True) for r in e["sizes"].values()) else " (WRONG)")
            out.append((key, label, xs, ys))
    return out


def _turn_axis(ax: Any, data: dict[str, Any]) -> None:
    ticks = sorted({(r["events"], int(t)) for e in data["targets"].values()
                    for t, r in e.get("sizes", {}).items() if "events" in r})
    ax.set_xticks([x for x, _ in ticks])
    ax.set_xticklabels([f"{x:,}\n(T={t})" for x, t in ticks])
    ax.minorticks_off()


def _footer(fig: Any, data: dict[str, Any]) -> None:
    env = data["env"]
    fig.text(0.01, 0.005, f"{env['date']} · {env['nproc']} cores · PostgreSQL {env['postgresql'].split()[0]} "
             f"(fsync on) · chat_session(T), ≈86 events/turn", fontsize=7, color="#666666")


def plot_line(data: dict[str, Any], metric: str, ylabel: str, title: str, path: Path,
              scale: float = 1.0) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.2), dpi=120)
    for key, label, xs, ys in _series(data, metric):
        ax.plot(xs, [y * scale for y in ys], label=label, **STYLE.get(key, {}))
    ax.set_xscale("log")
    ax.set_yscale("log")
    _turn_axis(ax, data)
    ax.set_xlabel("session length (events)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _footer(fig, data)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def plot_append(data: dict[str, Any], path: Path) -> None:
    turns = sorted({int(t) for e in data["targets"].values() for t in e.get("sizes", {})})
    if not turns:
        return
    t = str(turns[len(turns) // 2])  # the middle size (T=50 by default)
    rows = []
    for key, e in data["targets"].items():
        r = e.get("sizes", {}).get(t)
        if not r or "error" in r or "skipped" in r:
            continue
        rows.append((key, e["label"], r.get("per_event_eps"), r.get("per_turn_eps")))
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=120)
    for ax, idx, title in ((axes[0], 2, "one event per transaction"), (axes[1], 3, "one turn per transaction")):
        names = [lbl for _, lbl, *_ in rows]
        vals = [row[idx] or 0 for row in rows]
        colors = [STYLE.get(k, {}).get("color", "#999999") for k, *_ in rows]
        y = range(len(rows))
        ax.barh(list(y), vals, color=colors, left=0)
        ax.set_yticks(list(y))
        ax.set_yticklabels(names if ax is axes[0] else [""] * len(names), fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        top = max(vals + [10])
        ax.set_xlim(1, top * 4)
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("events per second (log scale)")
        ax.set_title(f"append, {title} (T={t})", fontsize=10)
        for i, v in enumerate(vals):
            ax.text(v if v else 1, i, f" {v:,.0f}" if v else " n/a (not this mode)", va="center", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    _footer(fig, data)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def plot_concurrency(data: dict[str, Any], path: Path) -> None:
    have = [(k, e) for k, e in data["targets"].items() if e.get("concurrency")]
    if not have:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.8), dpi=120)
    for key, e in have:
        cells = sorted(((int(w), c) for w, c in e["concurrency"].items() if "eps" in c and c["events"]),
                       key=lambda wc: wc[0])
        if not cells:
            continue
        ws = [w for w, _ in cells]
        ax1.plot(ws, [c["eps"] for _, c in cells], label=e["label"], **STYLE.get(key, {}))
        ax2.plot(ws, [c["p99_ms"] for _, c in cells], label=e["label"], **STYLE.get(key, {}))
    for ax, ylabel, title in ((ax1, "events per second (log)", "throughput"),
                              (ax2, "p99 append latency (ms, log)", "p99 latency")):
        ax.set_xscale("log", base=2)
        ws = sorted({int(w) for _, e in have for w in e["concurrency"]})
        ax.set_xticks(ws)
        ax.set_xticklabels([str(w) for w in ws])
        ax.minorticks_off()
        ax.set_xlabel("concurrent writers (processes, one session each)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, one event per transaction", fontsize=10)
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log")
    ax2.set_yscale("log")
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    _footer(fig, data)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def write_all(data: dict[str, Any], out: Path) -> list[Path]:
    """Draw every figure of a ``compare`` run into directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare-bytes.png", out / "compare-load-head.png",
             out / "compare-append.png", out / "compare-concurrency.png"]
    plot_line(data, "bytes", "bytes on disk per session (tables + indexes + TOAST)",
              "Storage per session vs session length", paths[0])
    plot_line(data, "load_head_ms", "load head state (ms, median)",
              "Load the current state vs session length", paths[1])
    plot_append(data, paths[2])
    plot_concurrency(data, paths[3])
    return [p for p in paths if p.exists()]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    src = Path(args[0]) if args else HERE / "out" / "compare.json"
    for p in write_all(json.loads(src.read_text()), HERE / "figures"):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
