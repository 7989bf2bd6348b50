"""The profiler's miss-ratio plot (matplotlib, imported only here)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ooc.core.errors import IOFailure
from ooc.core.sizes import format_size


def _fmt(n: float) -> str:
    return format_size(n)


def plot_curves(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """Miss ratio vs feature-cache size of the schedule training runs, the
    recommended size marked; PNG written to a temp name, then renamed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mc = report["miss_curves"]
    rec = report["recommendation"]
    x = np.array(mc["capacity_fraction"]) * 100
    sb = rec.get("superbatch_size")
    series = [("ooc", f"ooc as trained (Belady changesets, superbatch {sb}, cache carried)",
               "-o", "C0"),
              ("ooc_with_switch", "ooc, counting the superbatch switches' reads", ":o", "C0"),
              ("static_degree", "static degree-ordered (PaGraph)", "-s", "C1"),
              ("lru", "LRU, cold start (reference)", "-^", "C2")]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    for key, label, style, color in series:
        if key.startswith("ooc") and rec.get("predicted_miss_policy") != "ooc":
            continue
        ax.plot(x, np.array(mc[key]) * 100, style, ms=4, lw=1.8, label=label, color=color)
    _mark_recommendation(ax, rec, x)
    _label_axes(ax, report, x)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8.5)
    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp.png")
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, out)
    except OSError as e:
        raise IOFailure(f"{out}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)
    return out


def _mark_recommendation(ax, rec: dict[str, Any], x: np.ndarray) -> None:
    """The recommended size on ``ax``: a dashed line at its fraction, a star at its
    predicted miss ratio (when the cache is not empty), and a callout with the numbers.
    ``rec``: the report's ``recommendation``; ``x``: float [k] curve sizes (%)."""
    fr = rec["feature_cache_fraction"] * 100
    pm = rec["predicted_miss_ratio"] * 100
    if fr > 0:
        ax.axvline(fr, color="k", ls="--", lw=1.2)
        ax.plot([fr], [pm], "k*", ms=12, zorder=5)
    # the callout sits in the lower left of the axes, inside the canvas whatever the point
    ax.annotate(f"recommended: {rec['feature_cache_rows']:,} rows "
                f"({fr:.1f}%, {_fmt(rec['feature_cache_bytes'])})\n"
                f"predicted miss ratio {pm:.1f}%, epoch {rec['expected_epoch_s']:.1f} s",
                xy=(max(fr, x.min()), pm), xycoords="data", xytext=(0.03, 0.06),
                textcoords="axes fraction", fontsize=9, ha="left", va="bottom",
                bbox=dict(boxstyle="round", fc="white", ec="0.6"),
                arrowprops=dict(arrowstyle="->", color="0.3"))


def _label_axes(ax, report: dict[str, Any], x: np.ndarray) -> None:
    """Log-scale size axis with percent ticks from the smallest size ``x`` (float [k],
    % of the feature table) on, both axes' limits and labels, and the title (the
    mode, the traced batches, the fanouts)."""
    ds, cfg, m = report["dataset"], report["config"], report["measured"]
    ax.set_xscale("log")
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100) if t >= x.min() * 0.9]
    ax.set_xticks(ticks, [f"{t}%" for t in ticks])
    ax.set_xlim(x.min() * 0.9, 110)
    ax.set_ylim(0, 105)
    ax.set_xlabel(f"feature cache size (% of the {ds['num_nodes']:,}-row feature table, log scale)")
    ax.set_ylabel("miss ratio (% of feature lookups read)")
    ax.set_title(f"Feature-cache miss ratio of one {cfg['mode']} epoch ({m['trace_batches']} "
                 f"batches of {cfg['batch_size']}, fanouts {','.join(map(str, cfg['fanouts']))};\n"
                 f"{m['batch_node_fraction']:.1%} of the nodes per batch)", fontsize=10)
