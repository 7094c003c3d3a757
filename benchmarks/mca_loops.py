"""Static throughput estimates of the hot loop of each kernel-table entry, by llvm-mca.

Usage (from the repository root, or with --root):

    python3 benchmarks/mca_loops.py neon                 # bn_neon.c, cortex-a76 and neoverse-n1
    python3 benchmarks/mca_loops.py avx2 --json out.json # bn_avx2.c, znver3 and skylake
    python3 benchmarks/mca_loops.py neon --entries '_f32$' --all-loops
    python3 benchmarks/mca_loops.py neon --loop apply_run_f32=.L3 --elements apply_run_f32=16
    python3 benchmarks/mca_loops.py neon --compare benchmarks/results/mca_neon_before.json

Direction check: benchmarks/mca_timer.c times some run entries in cache on
the host (build steps in its comment, from this script's --save-asm so that
both see the same code); --timings FILE then prints the estimates next to the
ns per element, the two orders and Spearman's rho per CPU model.
benchmarks/results/ holds the runs: mca_neon_before.txt (bn_neon.c before it
moves onto the shared loops), mca_avx2.txt with its timings.

Before and after a change to the loops: --json on the old checkout (or
--root it), then --compare that file on the new one, which adds c/el
before, after and after / before per entry and CPU model.

What it does:

1. Compiles the ISA's kernel file to assembly with the flags setup.py gives it
   (-O3 -std=c11 -fno-math-errno -fvisibility=hidden -fPIC, the ISA flags and
   its CFBN_HAVE_* macro; aarch64 with aarch64-linux-gnu-gcc -march=armv8-a).
   --asm FILE analyses a saved .s instead; --save-asm FILE keeps the one made.
2. Reads the entries of the kernel table (cfbn_kernels_neon, cfbn_kernels_avx2):
   every function whose address is in it.  For each entry it finds the hot
   loop among the loops of the entry and of the local functions it calls or
   jumps to (.cold parts excluded):
     - a loop is a backward branch to a label of the same function; its body
       is the straight text from the label to the branch;
     - only innermost loops count (no other loop inside), none that calls
       a function (tails through memcpy and the like) and none without
       floating-point arithmetic (copies, conversions, prefetches);
     - of those, the one handling the most elements per iteration (the
       unrolled main body, not its remainder loop), then the one with the
       fewest instructions: where a rare case (a NaN to round, say) branches
       off the body and rejoins it, the common path is the shorter loop in
       the text; in a fused entry, with one loop per activation and side
       input, it is the cheapest of them (--all-loops shows the others).
   --loop ENTRY=LABEL (or ENTRY=FUNC:LABEL) names the loop instead;
   --all-loops lists every candidate.
3. Elements per iteration come from the pointer increments: each register
   that a memory operand of the body uses as base or index and that the body
   adds a constant to (add/sub, post- or pre-index writeback; x86 add, sub,
   lea, inc, dec) advances that operand by a known number of bytes per
   iteration; elements = the smallest such advance divided by the entry's
   element size (f32 4, f16 and bf16 2, f64 8).  The smallest, because the
   tensors advance by their element size while per-column parameters and
   double accumulators advance by 4 or 8 bytes per element.  When no operand
   advances by a constant (a stride held in a register) the count is "?";
   --elements ENTRY=N sets it.
4. Runs llvm-mca (-iterations 1000) on the body for each CPU model and
   reports cycles per iteration (Total Cycles / Iterations: the simulated
   steady state, loop-carried dependences included), Block RThroughput (the
   resource bound alone) and cycles per element.

What the numbers mean: an estimate of one loop body run from L1, on the
scheduling model llvm-mca has for that CPU.  They are not memory bandwidth
(a large tensor streams from DRAM and is bandwidth-bound well above these
cycle counts), not the per-call or per-row costs (setup, tails, the choice
of path by width), and not the branch or loop-stream behaviour of the real
core.  Compare entries and compare before with after on the same llvm-mca;
do not read them as nanoseconds.  LLVM before 17 has no Neoverse N1 model and
(before a much later release) no Cortex-A76 one: both names then select the
Cortex-A57 model, and their columns come out the same (the header says so).

What the loop choice can get wrong (check with --all-loops, fix with --loop):
  - a loop is the text from its label to its backward branch.  A body that
    GCC lays out in pieces (a rare path placed elsewhere that jumps back in,
    a loop entered in its middle) is either missing a piece or carries the
    rare path; where the rare path branches back into the body, two
    overlapping loops appear and the shorter (the common path) is taken;
  - a loop whose pointers advance by a register (a row stride, a run
    stride) has no element count and ranks below any loop that has one,
    a per-column setup loop included: the element size is the tensor's, so
    a loop over float or double scratch seems to cover more elements than it
    does.  NEON's ggstats_rows_f16/bf16 pick such a loop (a 261-instruction
    fold of double partial sums per column; the 8-element body that
    ggstats_run_f16 shows is among --all-loops), and so do AVX2's
    gstats_rows_fused_f16/bf16 (an 11-instruction check over double column
    sums);
  - a fused entry shows its cheapest activation loop, not the one a given
    model runs; which loop runs also depends on n, the width and alignment
    (a small n or an odd width takes a narrower loop than the one shown);
  - llvm-mca models no caches (every access hits L1), prefetches, branch
    misses or loop buffers, and its CPU models are approximations.

Plain Python 3, standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Flags setup.py gives an ISA file (COMMON_FLAGS + the ISA's; -fPIC as for any
# extension source).
COMMON_FLAGS = ["-O3", "-std=c11", "-fno-math-errno", "-fvisibility=hidden", "-fPIC"]

ISAS = {
    "neon": {
        "source": "csrc/bn_neon.c",
        "cc": "aarch64-linux-gnu-gcc",
        "flags": ["-march=armv8-a"],
        "macro": "CFBN_HAVE_NEON",
        "table": "cfbn_kernels_neon",
        "triple": "aarch64",
        "cpus": ["cortex-a76", "neoverse-n1"],
        "arch": "aarch64",
    },
    "avx2": {
        "source": "csrc/bn_avx2.c",
        "cc": "gcc",
        "flags": ["-mavx2", "-mfma", "-mf16c"],
        "macro": "CFBN_HAVE_AVX2",
        "table": "cfbn_kernels_avx2",
        "triple": "x86_64",
        "cpus": ["znver3", "skylake"],
        "arch": "x86_64",
    },
}

ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}


def element_bytes(entry):
    return ELEMENT_BYTES.get(entry.rsplit("_", 1)[-1], 4)


# ---- assembly: functions, table, loops ----

def parse_functions(lines):
    """name -> list of the function's lines (label to .size)."""
    names = set()
    for line in lines:
        m = re.match(r"\s*\.type\s+([\w.$]+)\s*,\s*[%@]function", line)
        if m:
            names.add(m.group(1))
    funcs, cur = {}, None
    for line in lines:
        m = re.match(r"([\w.$]+):", line)
        if m and m.group(1) in names:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None:
            continue
        if re.match(r"\s*\.size\s+" + re.escape(cur) + r"\s*,", line):
            cur = None
            continue
        funcs[cur].append(line)
    return funcs


def table_entries(lines, table):
    """The symbols whose addresses the table holds, in table order."""
    aliases = {}
    for line in lines:
        m = re.match(r"\s*\.set\s+([\w.$]+)\s*,\s*([\w.$]+)\s*$", line)
        if m:
            aliases[m.group(1)] = m.group(2)
    out, inside = [], False
    for line in lines:
        if re.match(re.escape(table) + r":", line):
            inside = True
            continue
        if not inside:
            continue
        if re.match(r"[\w.$]+:", line) or re.match(r"\s*\.size\s", line):
            break
        m = re.match(r"\s*\.(?:xword|quad|dword|8byte)\s+([A-Za-z_][\w.$]*)\s*$", line)
        if m and not m.group(1).startswith(".L"):
            out.append((m.group(1), aliases.get(m.group(1), m.group(1))))
    return out


def strip_comment(line, arch):
    return line.split("//")[0] if arch == "aarch64" else line.split("#")[0]


def instructions(body, arch):
    """(kind, text) for each label ('label') or instruction ('insn') line."""
    out = []
    for raw in body:
        line = strip_comment(raw, arch).strip()
        if not line:
            continue
        m = re.match(r"([\w.$]+):\s*(.*)$", line)
        if m:
            out.append(("label", m.group(1)))
            line = m.group(2).strip()
            if not line:
                continue
        if line.startswith("."):
            continue  # directive
        out.append(("insn", line))
    return out


AARCH64_BRANCH = re.compile(r"(b|b\.\w+|b(?:eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al)|cbn?z|tbn?z)$")


def split_insn(text):
    """mnemonic, operand text"""
    parts = text.split(None, 1)
    return parts[0], (parts[1] if len(parts) > 1 else "")


def branch_target(text, arch):
    mnem, ops = split_insn(text)
    ops = [o.strip() for o in ops.split(",")]
    if arch == "aarch64":
        if AARCH64_BRANCH.match(mnem):
            return ops[-1]
    elif mnem.startswith("j"):
        return ops[-1].lstrip("*")
    return None


def is_call(text, arch):
    mnem = text.split()[0]
    return mnem in ("bl", "blr") if arch == "aarch64" else mnem.startswith("call")


def call_targets(insns, arch):
    """Local names this code calls or jumps to."""
    out = []
    for kind, text in insns:
        if kind != "insn":
            continue
        mnem = text.split()[0]
        if (arch == "aarch64" and mnem in ("b", "bl")) or (arch != "aarch64" and mnem in ("jmp", "call", "callq")):
            out.append(text.split()[-1].replace("@PLT", ""))
    return out


def falls_through(insns, start, end, arch):
    """Whether control that enters at start can reach end without leaving the text between.

    GCC places shared tails (an epilogue, a reduction) above the blocks that
    jump back to them: a backward jump to such a block is no loop, and its
    text holds a return or a jump away.  A real loop body holds neither.
    """
    inside = {text for kind, text in insns[start:end + 1] if kind == "label"}
    for kind, text in insns[start:end]:
        if kind != "insn":
            continue
        mnem, ops = split_insn(text)
        if mnem in ("ret", "retq", "br", "eret"):
            return False
        if mnem in ("b", "jmp", "jmpq"):
            if ops.strip() not in inside:
                return False
    return True


def find_loops(insns, arch):
    """Innermost loops: (label, start, end) over indexes into insns."""
    labels = {}
    for i, (kind, text) in enumerate(insns):
        if kind == "label":
            labels[text] = i
    loops = []
    for i, (kind, text) in enumerate(insns):
        if kind != "insn":
            continue
        t = branch_target(text, arch)
        if t in labels and labels[t] < i and falls_through(insns, labels[t], i, arch):
            loops.append((t, labels[t], i))
    inner = []
    for lp in loops:
        nested = any(o is not lp and lp[1] <= o[1] and o[2] <= lp[2] and (o[1], o[2]) != (lp[1], lp[2])
                     for o in loops)
        if not nested:
            # depth: the loops around it (distinct ranges that contain it)
            depth = len({(o[1], o[2]) for o in loops
                         if o[1] <= lp[1] and lp[2] <= o[2] and (o[1], o[2]) != (lp[1], lp[2])})
            inner.append(lp + (depth,))
    return inner


# ---- elements per iteration from pointer increments ----

def norm_reg(r, arch):
    r = r.strip().lstrip("%").lower()
    if arch == "aarch64":
        return "x" + r[1:] if re.match(r"w\d+$", r) else r
    m = re.match(r"(r\d+)[dwb]?$", r)
    if m:
        return m.group(1)
    m = re.match(r"[re]?([abcd])[xlh]$", r)
    if m:
        return "r%sx" % m.group(1)
    m = re.match(r"[re]?(si|di|bp|sp)l?$", r)
    if m:
        return "r" + m.group(1)
    return r


def imm(s):
    s = s.strip().lstrip("#$")
    try:
        return int(s, 0)
    except ValueError:
        return None


def mem_operands(text, arch):
    """(base, index, scale) of each memory operand, and writebacks {reg: bytes}."""
    mems, wb = [], {}
    if arch == "aarch64":
        for m in re.finditer(r"\[([^\]]+)\](!)?(?:\s*,\s*(#?-?\w+))?", text):
            parts = [p.strip() for p in m.group(1).split(",")]
            base = norm_reg(parts[0], arch)
            index, scale, off = None, 1, 0
            if len(parts) > 1:
                if re.match(r"[xw]\d+$", parts[1]):
                    index = norm_reg(parts[1], arch)
                    if len(parts) > 2:
                        sh = re.search(r"(\d+)", parts[2])
                        scale = 1 << int(sh.group(1)) if sh else 1
                else:
                    off = imm(parts[1]) or 0
            mems.append((base, index, scale))
            if m.group(2):
                wb[base] = wb.get(base, 0) + off
            elif m.group(3) is not None:
                post = imm(m.group(3))
                wb[base] = None if post is None or wb.get(base, 0) is None else wb.get(base, 0) + post
    else:
        for m in re.finditer(r"(-?\w*)\((%\w+)?(?:\s*,\s*(%\w+)(?:\s*,\s*(\d))?)?\)", text):
            base = norm_reg(m.group(2), arch) if m.group(2) else None
            index = norm_reg(m.group(3), arch) if m.group(3) else None
            mems.append((base, index, int(m.group(4) or 1)))
    return mems, wb


def register_steps(body, arch):
    """reg -> bytes added per iteration (None: not a constant)."""
    steps = {}

    def add(reg, v):
        if reg in steps and (steps[reg] is None or v is None):
            steps[reg] = None
        else:
            steps[reg] = steps.get(reg, 0) + v if v is not None else None

    for text in body:
        mnem, rest = split_insn(text)
        ops = [o.strip() for o in re.split(r",(?![^\[(]*[\])])", rest)]
        if arch == "aarch64":
            _, wb = mem_operands(text, arch)
            for reg, v in wb.items():
                add(reg, v)
            if mnem in ("add", "sub") and len(ops) == 3 and re.match(r"[xw]\d+$", ops[0]):
                d, s = norm_reg(ops[0], arch), norm_reg(ops[1], arch)
                v = imm(ops[2])
                if d == s:
                    add(d, None if v is None else (v if mnem == "add" else -v))
                else:
                    steps[d] = None  # recomputed from elsewhere: unknown step
            elif re.match(r"[xw]\d+$", ops[0] if ops else "") and mnem not in ("cmp", "cmn", "tst") \
                    and not mnem.startswith(("st", "b", "cb", "tb")):
                # any other write to a general register: not a constant step
                steps[norm_reg(ops[0], arch)] = None
        else:
            if not ops or not ops[-1].startswith("%"):
                continue
            d = norm_reg(ops[-1], arch)
            m = re.match(r"(add|sub)[qlwb]?$", mnem)
            if m and len(ops) == 2:
                v = imm(ops[0]) if ops[0].startswith("$") else None
                add(d, None if v is None else (v if m.group(1) == "add" else -v))
            elif re.match(r"(inc|dec)[qlwb]?$", mnem) and len(ops) == 1:
                add(d, 1 if mnem.startswith("inc") else -1)
            elif re.match(r"lea[ql]?$", mnem) and len(ops) == 2:
                mm = re.match(r"(-?\d*)\((%\w+)\)$", ops[0])
                if mm and norm_reg(mm.group(2), arch) == d:
                    add(d, int(mm.group(1) or 0))
                else:
                    steps[d] = None
            elif re.match(r"(cmp|test|vcmp|vptest|ucomis|comis)", mnem):
                continue
            elif not re.match(r"v", mnem) or d in ("",):
                steps[d] = None
    return steps


# Floating-point arithmetic (not moves, conversions, compares or logic): a
# loop without any is a setup or copy loop, not a kernel's hot loop.
FP_ARITH = {
    "aarch64": re.compile(r"f(add|sub|mul|div|mla|mls|max|min|maxnm|minnm|neg|abs|sqrt|madd|msub|nmadd|nmsub)p?$"),
    "x86_64": re.compile(r"v?(add|sub|mul|div|max|min|sqrt|hadd|f?n?madd\d*|f?n?msub\d*)[ps][sd]$"),
}


def has_fp_arith(body, arch):
    return any(FP_ARITH[arch].match(split_insn(t)[0]) for t in body)


def elements_per_iteration(body, arch, ebytes):
    steps = register_steps(body, arch)
    advances = []
    for text in body:
        if split_insn(text)[0].startswith(("prfm", "prefetch")):
            continue  # a prefetch reads ahead of the data, at its own pace
        mems, _ = mem_operands(text, arch)
        for base, index, scale in mems:
            if base in ("sp", "rsp", "rip"):
                continue
            sb = steps.get(base, 0) if base else 0
            si = steps.get(index, 0) if index else 0
            if sb is None or si is None:
                continue
            adv = abs(sb + si * scale)
            if adv:
                advances.append(adv)
    if not advances:
        return None
    n = min(advances) / ebytes
    return int(n) if n == int(n) else n


# ---- llvm-mca ----

def run_mca(mca, triple, cpu, body_lines, iterations):
    with tempfile.NamedTemporaryFile("w", suffix=".s", prefix="mca_loop_", delete=False) as f:
        f.write("\n".join(body_lines) + "\n")
        path = f.name
    try:
        r = subprocess.run([mca, "-mtriple=" + triple, "-mcpu=" + cpu, "-iterations=%d" % iterations, path],
                           capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or ["llvm-mca failed"])
        return {"error": " ".join(m for m in msg if "error" in m)[:200] or msg[0][:200]}
    out = {}
    for key, pat in (("iterations", r"Iterations:\s+(\d+)"), ("total_cycles", r"Total Cycles:\s+(\d+)"),
                     ("rthroughput", r"Block RThroughput:\s+([\d.]+)")):
        m = re.search(pat, r.stdout)
        out[key] = float(m.group(1)) if m else None
    out["cycles_per_iter"] = out["total_cycles"] / out["iterations"] if out["iterations"] else None
    return out


def mca_text(insns, start, end, arch):
    """The loop body as llvm-mca input: its labels (so the branch resolves) and instructions."""
    out = []
    for kind, text in insns[start:end + 1]:
        out.append(text + ":" if kind == "label" else "\t" + text)
    return out


# ---- driver ----

def git_commit(root):
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "csrc"], capture_output=True,
                               text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compile_asm(isa, root, cc):
    cfg = ISAS[isa]
    cmd = [cc or cfg["cc"]] + COMMON_FLAGS + cfg["flags"] + ["-D%s=1" % cfg["macro"], "-I" + os.path.join(root, "csrc"),
                                                            "-S", os.path.join(root, cfg["source"]), "-o", "-"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("mca_loops: %s\n%s" % (" ".join(map(shlex.quote, cmd)), r.stderr))
    return r.stdout


def pairs(items, what):
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep:
            sys.exit("mca_loops: %s wants ENTRY=VALUE, got %r" % (what, it))
        out[k] = v
    return out


def analyse(asm, isa, args):
    cfg = ISAS[isa]
    arch = cfg["arch"]
    lines = asm.splitlines()
    funcs = parse_functions(lines)
    entries = table_entries(lines, cfg["table"])
    if not entries:
        sys.exit("mca_loops: table %s not found in the assembly" % cfg["table"])
    named_loops = pairs(args.loop, "--loop")
    named_elems = pairs(args.elements, "--elements")
    pattern = re.compile(args.entries) if args.entries else None
    cpus = args.cpus.split(",") if args.cpus else cfg["cpus"]
    parsed = {name: instructions(body, arch) for name, body in funcs.items()}
    rows = []
    for entry, sym in entries:
        if pattern and not pattern.search(entry):
            continue
        # the entry and the local functions it reaches, hot parts only
        seen, todo = [], [sym]
        while todo:
            f = todo.pop(0)
            if f in seen or f not in parsed or f.endswith(".cold"):
                continue
            seen.append(f)
            todo += call_targets(parsed[f], arch)
        cands = []
        for f in seen:
            insns = parsed[f]
            for label, start, end, depth in find_loops(insns, arch):
                body = [t for k, t in insns[start:end + 1] if k == "insn"]
                calls = any(is_call(t, arch) for t in body) or not has_fp_arith(body, arch)
                cands.append({"func": f, "label": label, "start": start, "end": end, "insns": len(body), "depth": depth,
                              "calls": calls, "elements": elements_per_iteration(body, arch, element_bytes(entry))})
        want = named_loops.get(entry)
        if want:
            wf, _, wl = want.rpartition(":")
            chosen = [c for c in cands if c["label"] == wl and (not wf or c["func"] == wf)]
            if not chosen:
                sys.exit("mca_loops: no innermost loop %s in %s (candidates: %s)"
                         % (want, entry, ", ".join(c["func"] + ":" + c["label"] for c in cands)))
        else:
            ok = [c for c in cands if not c["calls"]]
            chosen = sorted(ok, key=lambda c: (-(c["elements"] or 0), c["insns"]))[:1]
        show = [c for c in cands if not c["calls"]] if args.all_loops else chosen
        if not show:
            rows.append({"entry": entry, "symbol": sym, "loop": None, "note": "no loop found"})
            continue
        for c in show:
            elems = c["elements"]
            if entry in named_elems:
                elems = float(named_elems[entry])
            text = mca_text(parsed[c["func"]], c["start"], c["end"], arch)
            row = {"entry": entry, "symbol": sym, "loop": c["func"] + ":" + c["label"],
                   "chosen": c in chosen, "instructions": c["insns"], "depth": c["depth"], "elements": elems,
                   "cpus": {}}
            for cpu in cpus:
                m = run_mca(args.llvm_mca, cfg["triple"], cpu, text, args.iterations)
                if elems and m.get("cycles_per_iter") is not None:
                    m["cycles_per_element"] = m["cycles_per_iter"] / elems
                row["cpus"][cpu] = m
            rows.append(row)
    return rows, cpus


def fmt(v, spec):
    return "?" if v is None else format(v, spec)


def table_text(rows, cpus, all_loops):
    head = "%-26s %-30s %4s %5s %5s" % ("entry", "loop", "nest", "insns", "elems")
    for cpu in cpus:
        head += "  %22s" % (cpu + " c/it rthr c/el")
    out = [head]
    for r in rows:
        if r.get("loop") is None:
            out.append("%-26s %s" % (r["entry"], r.get("note", "")))
            continue
        mark = "*" if all_loops and r["chosen"] else " "
        line = "%-26s %-30s %4d %5d %5s" % (r["entry"] + mark, r["loop"], r["depth"], r["instructions"],
                                        fmt(r["elements"], "g"))
        for cpu in cpus:
            m = r["cpus"][cpu]
            if "error" in m:
                line += "  %22s" % ("error")
            else:
                line += "  %6s %6s %8s" % (fmt(m["cycles_per_iter"], ".2f"), fmt(m["rthroughput"], ".2f"),
                                          fmt(m.get("cycles_per_element"), ".3f"))
        out.append(line)
    errors = [(r["entry"], cpu, r["cpus"][cpu]["error"]) for r in rows if r.get("cpus")
              for cpu in cpus if "error" in r["cpus"][cpu]]
    for e in errors:
        out.append("error: %s on %s: %s" % e)
    return "\n".join(out)


def same_columns(rows, cpus):
    """True when every CPU model gave the same numbers (one scheduling model behind several names)."""
    if len(cpus) < 2:
        return False
    vals = [[r["cpus"][c].get("total_cycles") for r in rows if r.get("cpus")] for c in cpus]
    return all(v == vals[0] for v in vals[1:]) and any(x is not None for x in vals[0])


def read_timings(path):
    """entry -> ns per element, from mca_timer's output."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#"):
                out[parts[0]] = float(parts[1])
    return out


def ranks(values):
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def timings_text(rows, cpus, timings):
    """The estimates next to measured ns/element, both orders, and Spearman's rho per CPU model."""
    both = [r for r in rows if r.get("chosen", True) and r.get("loop") and r["entry"] in timings]
    if len(both) < 2:
        return "timings: fewer than two entries both estimated and timed"
    out = ["", "# estimate against timing (ns/element, best of samples); GHz = c/el / (ns/el)",
           "%-20s %8s" % ("entry", "ns/el") + "".join("  %16s" % (cpu + " c/el GHz") for cpu in cpus)]
    for r in both:
        line = "%-20s %8.4f" % (r["entry"], timings[r["entry"]])
        for cpu in cpus:
            ce = r["cpus"][cpu].get("cycles_per_element")
            line += "  %8s %7s" % (fmt(ce, ".3f"), fmt(ce / timings[r["entry"]] if ce else None, ".2f"))
        out.append(line)
    out.append("")
    by_time = sorted(both, key=lambda r: timings[r["entry"]])
    out.append("timed order (fastest first): " + ", ".join(r["entry"] for r in by_time))
    for cpu in cpus:
        ok = [r for r in both if r["cpus"][cpu].get("cycles_per_element") is not None]
        if len(ok) < 2:
            continue
        est = [r["cpus"][cpu]["cycles_per_element"] for r in ok]
        tim = [timings[r["entry"]] for r in ok]
        by_est = sorted(ok, key=lambda r: r["cpus"][cpu]["cycles_per_element"])
        out.append("%s order (fastest first): %s" % (cpu, ", ".join(r["entry"] for r in by_est)))
        out.append("%s: Spearman rho %.2f over %d entries" % (cpu, spearman(est, tim), len(ok)))
    return "\n".join(out)


def compare_text(rows, cpus, before_path, pattern):
    """c/el of each entry before (an earlier --json) and now, and now / before."""
    with open(before_path) as f:
        before = json.load(f)
    old = {r["entry"]: r for r in before["rows"] if r.get("loop") and r.get("chosen", True)}
    out = ["", "# against %s" % before.get("header", before_path).lstrip("# "),
           "%-26s" % "entry" + "".join("  %26s" % (cpu + " before after ratio") for cpu in cpus)]
    for r in rows:
        if not r.get("loop") or not r.get("chosen", True) or r["entry"] not in old:
            continue
        line = "%-26s" % r["entry"]
        for cpu in cpus:
            a = old[r["entry"]].get("cpus", {}).get(cpu, {}).get("cycles_per_element")
            b = r["cpus"][cpu].get("cycles_per_element")
            line += "  %8s %8s %8s" % (fmt(a, ".3f"), fmt(b, ".3f"), fmt(b / a if a and b else None, ".2f"))
        out.append(line)
    gone = sorted(e for e in set(old) - {r["entry"] for r in rows} if not pattern or pattern.search(e))
    if gone:
        out.append("only before: " + ", ".join(gone))
    return "\n".join(out)


def mca_version(mca):
    try:
        out = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    except OSError:
        sys.exit("mca_loops: %s not found (apt-get install llvm)" % mca)
    m = re.search(r"LLVM version ([\d.]+)", out)
    return m.group(1) if m else "?"


def cfg_triple(isa):
    return ISAS[isa]["triple"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="llvm-mca estimates of the hot loop of each kernel-table entry.")
    ap.add_argument("isa", choices=sorted(ISAS))
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the checkout to analyse (default: this one)")
    ap.add_argument("--asm", help="analyse this .s instead of compiling")
    ap.add_argument("--save-asm", help="write the compiled .s here")
    ap.add_argument("--cc", help="compiler (default: aarch64-linux-gnu-gcc for neon, gcc for avx2)")
    ap.add_argument("--cpus", help="comma-separated -mcpu values (default: neon cortex-a76,neoverse-n1; "
                                   "avx2 znver3,skylake)")
    ap.add_argument("--entries", help="regular expression on entry names")
    ap.add_argument("--loop", action="append", metavar="ENTRY=[FUNC:]LABEL", help="use this loop for the entry")
    ap.add_argument("--elements", action="append", metavar="ENTRY=N", help="elements per iteration of its loop")
    ap.add_argument("--all-loops", action="store_true", help="every innermost call-free loop; * marks the chosen")
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--llvm-mca", default="llvm-mca")
    ap.add_argument("--json", help="write the rows here as JSON")
    ap.add_argument("--timings", help="mca_timer's output: compare the estimates' order with it")
    ap.add_argument("--compare", metavar="JSON", help="an earlier --json (the 'before'): c/el before, now, ratio")
    args = ap.parse_args(argv)

    version = mca_version(args.llvm_mca)
    if args.asm:
        with open(args.asm) as f:
            asm = f.read()
    else:
        asm = compile_asm(args.isa, args.root, args.cc)
        if args.save_asm:
            with open(args.save_asm, "w") as f:
                f.write(asm)
    rows, cpus = analyse(asm, args.isa, args)

    cmd = "python3 benchmarks/mca_loops.py " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    header = "# %s UTC, commit %s, llvm-mca %s: %s" % (
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), git_commit(args.root), version, cmd)
    notes = ["# per CPU: c/it = cycles per iteration (llvm-mca Total Cycles / Iterations), rthr = Block "
             "RThroughput, c/el = c/it / elements per iteration; from L1, one loop body, no memory bandwidth"]
    if same_columns(rows, cpus):
        notes.append("# the CPU models gave identical numbers: this llvm-mca has one scheduling model behind them"
                     + (" (before LLVM 17, Cortex-A57's for both cortex-a76 and neoverse-n1)"
                        if cfg_triple(args.isa) == "aarch64" else ""))
    print("\n".join([header] + notes))
    print(table_text(rows, cpus, args.all_loops))
    if args.timings:
        print(timings_text(rows, cpus, read_timings(args.timings)))
    if args.compare:
        print(compare_text(rows, cpus, args.compare, re.compile(args.entries) if args.entries else None))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "isa": args.isa, "cpus": cpus, "llvm_mca": version, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
