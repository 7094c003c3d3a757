#!/usr/bin/env python
"""Figures from the benchmarks' JSON files (matplotlib: pip install -e ".[plot]").

    python benchmarks/plot.py layers    torch_layers.json  docs/figures/layers.svg
    python benchmarks/plot.py bandwidth compare.json       docs/figures/bandwidth.svg
    python benchmarks/plot.py ratios    compare.json       docs/figures/compare.svg
    python benchmarks/plot.py steps     torch_resnet.json  docs/figures/resnet18.svg

- ``layers``: ``benchmarks/torch_layers.py --compile --json``: one layer's
  forward + backward per shape, cfbn.torch and ``torch.compile`` as time
  relative to PyTorch eager;
- ``bandwidth``: ``benchmarks/compare.py --json`` (its large-tensor section):
  cfbn's and PyTorch's effective bandwidth beside the copy bandwidth measured
  with them;
- ``ratios``: ``benchmarks/compare.py --json`` (its target cells): cfbn's time
  over PyTorch's CPU batch norm per shape, op and layout;
- ``steps``: ``benchmarks/torch_resnet.py --json`` or
  ``benchmarks/torch_models.py --json``: whole training steps.

Each figure carries a caption: the machine, the date and the command that
measured it (from the JSON), this command, and ``--note`` (say there whether
the machine was shared or quiet).  SVG text stays text, so the files are small
and do not change when redrawn from the same data.
"""
import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from cfbn import _plot

# compare.py's op names (benchmarks/_bench_common.py's OPS), shortened for a tick label
OPS = {"train": "training forward", "infer": "inference forward", "grad": "training gradient"}


def relative_command(cmd, json_name=None):
    """A recorded command line with the interpreter as `python`, the script
    relative to the repository and the --json file under the name it is
    drawn from (the caption names no local paths)."""
    words = shlex.split(cmd or "")
    out = []
    for i, w in enumerate(words):
        m = re.search(r"(benchmarks/[\w.]+\.py)$", w)
        if json_name and i > 0 and words[i - 1] == "--json":
            out.append(json_name)
        elif i == 0 and re.search(r"python[\d.]*$", w):
            out.append("python")
        elif m:
            out.append(m.group(1))
        elif w.startswith("/") and ("json" in w or "/tmp" in w):
            out.append(Path(w).name)
        else:
            out.append(w)
    if out and out[0] != "python" and out[0].startswith("benchmarks/"):
        out.insert(0, "python")
    return shlex.join(out)


def caption_text(doc, argv, note, json_name=None):
    m = doc["machine"]
    cpu = m.get("cpu", "unknown CPU")
    threads = m.get("threads") or m.get("max_threads")
    parts = ["Measured %s on %s%s" % (str(m.get("date", "?"))[:10], cpu,
                                       ", %s threads" % threads if threads else "")]
    versions = ", ".join("%s %s" % (k, m[k]) for k in ("torch", "numpy", "python") if m.get(k))
    if versions:
        parts[0] += " (%s)" % versions
    parts[0] += "; by `%s`." % relative_command(m.get("command"), json_name)
    if note:
        parts.append(note)
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--note":
            skip = True
        elif not a.startswith("--note="):
            shown.append(Path(a).name if a.endswith(".json") else a)
    parts.append("Drawn by `python benchmarks/plot.py %s`." % " ".join(shown))
    return "\n".join(parts)


def shape_label(shape):
    return "x".join(map(str, shape))


def fig_layers(doc, plt):
    cells = doc["cells"]
    forms = list(dict.fromkeys(c["form"] for c in cells))
    formats = list(dict.fromkeys(c["format"] for c in cells))
    panels = [(f, fm) for f in forms for fm in formats]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 5.2), squeeze=False)
    for ax, (form, fmt) in zip(axes[0], panels):
        sel = [c for c in cells if c["form"] == form and c["format"] == fmt]
        labels = [shape_label(c["shape"]) for c in sel]
        series = {"PyTorch eager": [1.0] * len(sel)}
        if all("compiled_s" in c for c in sel):
            series["torch.compile"] = [c["compiled_s"] / c["torch_s"] for c in sel]
        series["cfbn.torch"] = [c["ratio"] for c in sel]
        _plot.bars(ax, labels, series, ylabel="time / PyTorch eager's (lower is faster)",
                   log=True, value_format="%.2f", unlabelled=("PyTorch eager",),
                   title="%s, %s, forward + backward; N x C x H x W" % (form, fmt))
    return fig


def fig_ratios(doc, plt):
    cells = [c for c in doc["cells"] if "ratio" in c]
    threads = max(c["threads"] for c in cells)
    cells = [c for c in cells if c["threads"] == threads]
    layouts = list(dict.fromkeys(c["layout"] for c in cells))
    fig, axes = plt.subplots(1, len(layouts), figsize=(5.6 * len(layouts), 5.2), squeeze=False)
    for ax, layout in zip(axes[0], layouts):
        sel = [c for c in cells if c["layout"] == layout]
        shapes = list(dict.fromkeys(tuple(c["shape"]) for c in sel))
        series = {}
        for op, name in OPS.items():
            by = {tuple(c["shape"]): c["ratio"] for c in sel if c["op"] == op}
            series[name] = [by.get(s) for s in shapes]
        _plot.bars(ax, [shape_label(s) for s in shapes], series,
                   ylabel="cfbn time / PyTorch time (lower is faster)", log=True, reference=1.0,
                   reference_label="as fast as PyTorch",
                   title="%s, float32, %d threads; N x H x W x C" % (layout, threads))
    return fig


def fig_bandwidth(doc, plt):
    large = doc.get("large")
    if not large:
        raise SystemExit("this JSON has no large-tensor section (compare.py without --no-large)")
    rows = large["rows"]
    labels = ["%s\n%s" % (r["layout"], OPS.get(r["op"], r["op"])) for r in rows]
    series = {"copy (np.copyto / torch copy_)": [r["copy_gbps"] for r in rows],
              "cfbn": [r["cfbn_gbps"] for r in rows],
              "cfbn, out= preallocated": [r["cfbn_out_gbps"] for r in rows]}
    if all("torch_gbps" in r for r in rows):
        series["PyTorch"] = [r["torch_gbps"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    _plot.bars(ax, labels, series, ylabel="effective bandwidth, GB/s (minimal bytes / time)",
               value_format="%.1f", title="Large tensor %s float32, 2 threads: bandwidth beside "
               "the copy's" % shape_label(large["shape"]))
    return fig


def fig_steps(doc, plt):
    groups = doc["results"]
    fig, ax = plt.subplots(figsize=(8, 5.2))
    if groups and "variants" in groups[0]:          # torch_models.py
        variants = doc["settings"]["variants"]
        labels = ["%s\n%s" % (g["model"], g["memory_format"]) for g in groups]
        series = {v: [g["variants"][v].get("median_s", float("nan")) * 1e3 for g in groups]
                  for v in variants}
    else:                                            # torch_resnet.py
        names = list(groups[0]["median_s"])
        labels = ["%s\n%s" % (g["model"], g["memory_format"]) for g in groups]
        pretty = {"torch": "PyTorch", "drop-in": "cfbn.torch convert(model)",
                  "fused": "convert(model, fuse=True)"}
        series = {pretty.get(n, n): [g["median_s"][n] * 1e3 for g in groups] for n in names}
    s = doc.get("settings", {})
    _plot.bars(ax, labels, series, ylabel="median training step, ms (lower is faster)",
               value_format="%.0f", title="Whole training steps (SGD), batch %s, %sx%s px" % (
                   s.get("batch", "?"), s.get("size", "?"), s.get("size", "?")))
    return fig


KINDS = {"layers": fig_layers, "ratios": fig_ratios, "bandwidth": fig_bandwidth,
         "steps": fig_steps}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("json", type=Path, help="a benchmark's --json output")
    ap.add_argument("out", type=Path, help="the figure: .svg, .png or .pdf")
    ap.add_argument("--note", default="", help="a sentence for the caption (the machine's load)")
    args = ap.parse_args(argv)
    try:
        plt = _plot.pyplot()
    except ImportError as exc:
        raise SystemExit(str(exc))
    doc = json.loads(args.json.read_text())
    fig = KINDS[args.kind](doc, plt)
    _plot.caption(fig, caption_text(doc, argv, args.note, args.json.name))
    _plot.save(fig, args.out)
    print("written %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
