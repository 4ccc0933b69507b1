"""Draw docs/img/system.png: Braid's processes on two sites, and what crosses between them.

    .venv/bin/python docs/img/system.py

The README shows the PNG. Edit the boxes and arrows below and run this again to redraw it (no
graphviz needed: matplotlib only, with its default DejaVu Sans font).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

HERE = Path(__file__).resolve().parent
SAMPLES = "#1f5fa8"  # prompts out, finished samples back
WEIGHTS = "#d0700a"  # weight versions
CONTROL = "#6b6b6b"  # Prefect: starts and watches processes
SITE_A = "#eef4fb"
SITE_B = "#fdf3e8"
PROC = "#ffffff"


def box(ax, x, y, w, h, title, body="", *, face=PROC, edge="#333333", size=10.5, dashed=False, bold=True):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.8", facecolor=face,
                                edgecolor=edge, linewidth=1.2, linestyle="--" if dashed else "-"))
    if body:
        ax.text(x + w / 2, y + h - 1.0, title, ha="center", va="top", fontsize=size,
                fontweight="bold" if bold else "normal")
        ax.text(x + w / 2, y + h - 3.4, body, ha="center", va="top", fontsize=size - 1.5, linespacing=1.25)
    else:
        ax.text(x + w / 2, y + h / 2, title, ha="center", va="center", fontsize=size,
                fontweight="bold" if bold else "normal")


def arrow(ax, start, end, color, *, style="-|>", width=2.0, dashed=False, rad=0.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=16, color=color, linewidth=width,
                                 linestyle=(0, (4, 3)) if dashed else "-", connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=0, shrinkB=0))


def label(ax, x, y, text, color, *, size=9.5, ha="center", rotation=0):
    ax.text(x, y, text, ha=ha, va="center", fontsize=size, color=color, rotation=rotation, linespacing=1.2,
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.9})


def draw() -> plt.Figure:
    fig = plt.figure(figsize=(10.8, 6.0))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, 120)
    ax.set_ylim(0, 66.7)
    ax.set_aspect("equal")
    ax.axis("off")

    # Prefect: the server, one work pool and worker per site
    box(ax, 2, 56.5, 116, 8.5, "Prefect server + UI",
        "deployments rl-training, gen-site, train-site, retrain-ranker, plan-allocation;\n"
        "one work pool per site; reports published as artifacts", face="#f2f2f2", edge=CONTROL, size=11)

    # the two sites
    for x0, face, edge, title in ((2, SITE_A, "#7a9cc6", "site A: generation, e.g. H20s"),
                                  (64, SITE_B, "#d9a066", "site B: training, e.g. H800s")):
        ax.add_patch(FancyBboxPatch((x0, 2), 54 if x0 == 64 else 46, 50.5, boxstyle="round,pad=0,rounding_size=1.2",
                                    facecolor=face, edgecolor=edge, linewidth=1.5))
        ax.text(x0 + 2.5, 50.2, title, ha="left", va="center", fontsize=12, fontweight="bold")

    # site A: the SGS (instances side by side) and the site's relay
    box(ax, 4.5, 42.5, 41, 4.5, "Prefect worker, pool braid-generation", face="#f2f2f2", edge=CONTROL, size=10,
        bold=False)
    ax.add_patch(FancyBboxPatch((4.5, 18.5), 41, 21.5, boxstyle="round,pad=0,rounding_size=0.8", facecolor="#f8fbff",
                                edgecolor="#333333", linewidth=1.2))
    ax.text(25, 38.8, "Stream Generation Service", ha="center", va="top", fontsize=10.5, fontweight="bold")
    for x, name in ((6, "instance 0"), (19.5, "instance 1"), (33, "instance k")):
        box(ax, x, 20, 11, 15, name, "vLLM\nengine,\nLPT\nadmission,\nown weight\nversion", size=9.5)
    box(ax, 4.5, 4, 41, 7.5, "site relay", "the latest K versions in CPU memory", size=10.5)
    for x in (11.5, 25, 38.5):
        arrow(ax, (x, 11.5), (x, 20), WEIGHTS, width=1.6)
    label(ax, 18.2, 15.6, "pull when idle", WEIGHTS, size=9)

    # site B: the trainer process (rollout orchestrator + learner), workers beside it, the master relay
    box(ax, 67, 42.5, 48, 4.5, "Prefect worker, pool braid-training", face="#f2f2f2", edge=CONTROL, size=10,
        bold=False)
    ax.add_patch(FancyBboxPatch((67, 15), 33, 25, boxstyle="round,pad=0,rounding_size=0.8", facecolor="#fffaf3",
                                edgecolor="#333333", linewidth=1.2))
    ax.text(83.5, 38.8, "trainer process", ha="center", va="top", fontsize=10.5, fontweight="bold")
    box(ax, 68.5, 26, 30, 10.5, "rollout orchestrator",
        "routes groups (ranker estimates);\nstaleness bound V_traj + \u03b7 \u2265 V_buf;\nexperience buffer", size=10)
    box(ax, 68.5, 16.5, 30, 7.5, "learner (own process)", "GRPO / PPO, torch or Megatron", size=10)
    box(ax, 102, 31, 14, 6.5, "reward\nworkers", face="#f7f7f7", size=9.5)
    box(ax, 102, 22, 14, 6.5, "environment\nworkers", face="#f7f7f7", size=9.5)
    arrow(ax, (98.5, 33.5), (102, 34.2), "#444444", style="<|-|>", width=1.2)
    arrow(ax, (98.5, 29), (102, 25.5), "#444444", style="<|-|>", width=1.2)
    box(ax, 67, 4, 33, 7.5, "master relay", "forwards each chunk as it arrives", size=10.5)
    arrow(ax, (83.5, 16.5), (83.5, 11.5), WEIGHTS)
    label(ax, 91.5, 14, "push (shm)", WEIGHTS, size=9)

    # across the link: prompts out and finished samples back (gRPC), one copy of each weight version
    arrow(ax, (68.5, 33.5), (45.5, 33.5), SAMPLES)
    label(ax, 56, 36.3, "prompts, a group\nper Generate call", SAMPLES, size=9)
    arrow(ax, (45.5, 28.5), (68.5, 28.5), SAMPLES)
    label(ax, 56, 25.2, "samples streamed\nas each finishes", SAMPLES, size=9)
    arrow(ax, (67, 7.75), (45.5, 7.75), WEIGHTS, width=2.6)
    label(ax, 56, 11.3, "one copy per\nversion (TLS)", WEIGHTS, size=9)

    # Prefect starts each site's processes through its pool's worker
    for x in (41, 111):
        arrow(ax, (x, 56.5), (x, 47), CONTROL, dashed=True, width=1.3)
        label(ax, x, 53.9, "starts, watches", CONTROL, size=9)

    # legend
    for i, (color, text) in enumerate(((SAMPLES, "samples"), (WEIGHTS, "weights"), (CONTROL, "control"))):
        ax.plot([49, 52], [46.5 - i * 2.7] * 2, color=color, linewidth=2.4, linestyle="--" if color == CONTROL else "-")
        ax.text(52.8, 46.5 - i * 2.7, text, va="center", fontsize=9.5)
    return fig


def main() -> None:
    fig = draw()
    fig.savefig(HERE / "system.png", dpi=150)
    print(f"wrote {HERE / 'system.png'}")


if __name__ == "__main__":
    main()
