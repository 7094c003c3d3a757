#!/usr/bin/env python
"""Runs every Python code block of the documentation: docs/*.md and README.md.

    python tools/check_docs.py [FILE ...] [--require MODULE ...] [--only MODULE]

The ```python blocks of one file run in order in one fresh interpreter (the
blocks of a page share their names, as a reader's session would), from an
empty temporary folder, so that ``import cfbn`` is the installed package.  A
block that needs an optional package says so on the line before its fence:

    <!-- check_docs: needs torch -->

and is skipped, and reported as skipped, where that package is not installed
(``cupy`` also needs a GPU); the blocks after it still run.  ``--require
MODULE`` turns a skip for MODULE into a failure (CI, where it is installed);
``--only MODULE`` runs only the blocks that need it.  Exit status 1 if a block
fails or a required one was skipped; each failure is reported with its file,
line and traceback.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEEDS = re.compile(r"<!--\s*check_docs:\s*needs\s+([\w, .-]+?)\s*-->")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def blocks(text):
    """(line number, info string, code, needs) of each fenced block; fences
    of more backticks enclose shorter ones, as in CommonMark."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).lower()
        start = i + 1
        j = start
        while j < len(lines) and not (lines[j].startswith(fence[0] * len(fence))
                                      and lines[j].strip(fence[0]) == ""):
            j += 1
        needs = []
        k = i - 1
        if k >= 0:
            n = NEEDS.search(lines[k])
            if n:
                needs = [v.strip() for v in re.split(r"[, ]+", n.group(1)) if v.strip()]
        # start + 1: the 1-based number of the block's first line of code
        out.append((start + 1, info, "\n".join(lines[start:j]), needs))
        i = j + 1
    return out


def python_blocks(path):
    return [(line, code, needs) for line, info, code, needs in blocks(path.read_text())
            if info in ("python", "py", "python3")]


# Runs in the child: each block in turn in one namespace; a JSON line per block.
CHILD = r'''
import importlib.util, json, sys, traceback
blocks = json.loads(sys.stdin.read())

def available(name):
    if importlib.util.find_spec(name) is None:
        return False
    if name == "cupy":
        try:
            import cupy
            return cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:
            return False
    return True

ns = {"__name__": "__main__"}
for b in blocks:
    missing = [n for n in b["needs"] if not available(n)]
    if missing:
        res = {"line": b["line"], "status": "skipped", "missing": missing}
    else:
        try:
            # blank lines first, so that a traceback gives the page's line numbers
            exec(compile("\n" * (b["line"] - 1) + b["code"], b["file"], "exec"), ns)
            res = {"line": b["line"], "status": "ok"}
        except BaseException:
            res = {"line": b["line"], "status": "failed", "error": traceback.format_exc()}
    sys.__stdout__.write("\n@@check_docs@@" + json.dumps(res) + "\n")
    sys.__stdout__.flush()
'''


def run_file(path, only=None, timeout=600):
    found = python_blocks(path)
    if only:
        found = [b for b in found if only in b[2]]
    if not found:
        return []
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    payload = json.dumps([{"file": rel, "line": line, "code": code, "needs": needs}
                          for line, code, needs in found])
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", CHILD], input=payload, capture_output=True,
                              text=True, cwd=tmp, env=env, timeout=timeout)
    results = [json.loads(line[len("@@check_docs@@"):]) for line in proc.stdout.splitlines()
               if line.startswith("@@check_docs@@")]
    if len(results) < len(found):   # the interpreter itself died
        done = {r["line"] for r in results}
        for line, _, _ in found:
            if line not in done:
                results.append({"line": line, "status": "failed",
                                "error": "the interpreter exited with status %d:\n%s"
                                % (proc.returncode, proc.stderr[-3000:])})
                break
    for r in results:
        r["file"] = rel
    return results


def default_files():
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="default: docs/**/*.md and README.md")
    ap.add_argument("--require", action="append", default=[], metavar="MODULE",
                    help="a block skipped for want of MODULE is a failure")
    ap.add_argument("--only", metavar="MODULE", help="run only the blocks that need MODULE")
    args = ap.parse_args(argv)
    files = args.files or default_files()
    results = []
    for path in files:
        results += run_file(Path(path).resolve(), args.only)
    failed = 0
    for r in results:
        where = "%s:%d" % (r["file"], r["line"])
        if r["status"] == "ok":
            print("ok       %s" % where)
        elif r["status"] == "skipped":
            required = [m for m in r["missing"] if m in args.require]
            print("%s  %s (needs %s)" % ("FAILED " if required else "skipped", where,
                                         ", ".join(r["missing"])))
            failed += bool(required)
        else:
            failed += 1
            print("FAILED   %s\n%s" % (where, r["error"]))
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "skipped", "failed")}
    print("%d blocks: %d ran, %d skipped, %d failed%s" % (
        len(results), counts["ok"], counts["skipped"], counts["failed"],
        "" if not failed or counts["failed"] == failed else " (and required skips)"))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
