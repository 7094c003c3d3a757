"""Figures of measured speed: grouped bars and a caption, drawn with matplotlib.

Used by ``python -m cfbn --plot FILE`` for this machine and by
``benchmarks/plot.py`` for the figures of the documentation, so both draw
alike.  matplotlib is optional (``pip install cfbn[plot]``) and imported only
here, when a figure is asked for.
"""
import textwrap

EXTRA_HINT = ('matplotlib is needed to draw figures: pip install "cfbn[plot]" '
              '(or the "docs" extra, which includes it)')


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend; an ImportError
    that names the extra where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # text stays text in SVG files (small, searchable), and the files do not
    # change from one drawing of the same data to the next
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "cfbn",
                         "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def bars(ax, labels, series, *, ylabel, title=None, log=False, reference=None,
         reference_label=None, value_format=None, unlabelled=()):
    """Grouped vertical bars: one group per label, one bar per series
    (name -> list of values, None where a value is missing).  `reference`
    draws a dashed horizontal line (a ratio of 1, or a copy's bandwidth);
    `value_format` writes each bar's value above it, except for the series
    named in `unlabelled`."""
    names = list(series)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(labels))]
        vals = series[name]
        pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
        if not pts:
            continue
        rects = ax.bar([p[0] for p in pts], [p[1] for p in pts], width * 0.95, label=name)
        if value_format and name not in unlabelled:
            ax.bar_label(rects, [value_format % p[1] for p in pts], fontsize=6, padding=1)
    if reference is not None:
        ax.axhline(reference, color="0.3", linestyle="--", linewidth=0.8,
                   label=reference_label)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    # the legend above the axes, under the title, where no bar reaches
    entries = len(names) + (reference is not None)
    ncol = min(entries, 3)
    ax.legend(fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=ncol)
    if title:
        rows = -(-entries // ncol)
        ax.set_title(title, fontsize=9, pad=8 + 12 * rows)


def caption(fig, text, width=150):
    """The figure's caption under the axes: the machine, the date and the
    command that measured it."""
    wrapped = "\n".join(textwrap.fill(p, width) for p in text.split("\n"))
    fig.text(0.01, 0.005, wrapped, fontsize=6.5, va="bottom", ha="left", color="0.25")
    lines = wrapped.count("\n") + 1
    inches = fig.get_size_inches()[1]
    # room for the rotated tick labels (about 1.4 inch) and the caption's lines,
    # and above the axes for a title over two rows of legend
    fig.subplots_adjust(bottom=min(0.6, (1.5 + 0.13 * lines) / inches),
                        top=1 - 0.9 / inches)


def save(fig, path):
    """Writes the figure (format from the file name: .svg, .png, .pdf)."""
    fig.savefig(path, metadata={"Date": None} if str(path).endswith(".svg") else None, dpi=110)
