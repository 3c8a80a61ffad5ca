"""What a step between two versions changed in the code, what it did to the time, and whether that is more than
noise (`python diff.py A B`, `make diff A= B=`).

Code: unified diffs of the device source (the KERNELS and BINDING strings) and of the Python around them, each with
added and removed line counts; a function or kernel that disappears from A while one with a similar body (80% or
more, names aside) appears in B is reported as a rename.

Time: the judge's clock (a2a/clock.py), the same method as the leaderboard's: in every round each version runs in
fresh processes of its own, makes its inputs (the same seeds for both), passes its check and is visited once per
shape, A and B in an order shuffled per round, one pool alive at a time; a visit is `steps` idle-stream and `steps`
held steps.
Why rounds of fresh processes: the process is where the variance lives (two processes of the same code differ by
up to ±15% in call time on one H100, by 20% on a CPU; steps within one process do not show it). Per shape and
timing, B/A is the geometric mean over rounds of the ratio of the two versions' values in the same round, with a
Student-t interval on the per-round log ratios (shown at 95%). Verdict: "B faster/slower by X% (±Y)" only when
the interval at the family-wise level (FAMILY_ALPHA, Bonferroni over every verdict of the run) excludes 1 and the
change is at least MIN_EFFECT; else "no difference within noise". So a version against itself says "no difference"
on every shape in at least 95% of runs, not only per shape.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import re
import statistics
import tokenize
from pathlib import Path
from typing import Optional

import wire
from a2a import intervals as iv
from eval import UserError

DEVICE_STRINGS = ("KERNELS", "BINDING")
RENAME_SIMILARITY = 0.8
MIN_EFFECT = 0.02
FAMILY_ALPHA = 0.05
ROUNDS = 8
ROUNDS_MAX = 1000  # each round starts every pool anew: 1000 is hours already
STEPS = 8  # steps of each kind per visit


# --------------------------------------------------------------------------------------------------------------
# Code
# --------------------------------------------------------------------------------------------------------------


def read_source(path: Path) -> str:
    """A version file's text as Python reads it (its coding line honoured, newlines made "\\n"); bad input (113)
    where Python could not read or parse it (red team 29: a latin-1 file ended diff.py with 114)."""
    try:
        with tokenize.open(path) as file:
            text = file.read()
        ast.parse(text)
    except (OSError, SyntaxError, UnicodeError, ValueError, RecursionError, MemoryError) as error:
        raise UserError(f"{path}: not a Python file Python can read ({type(error).__name__})") from None
    return text


def lines_of(text: str) -> list:
    """The lines as Python's tokenizer counts them: split at "\\n" only (str.splitlines also splits at U+2028 and
    others, which moved every later line against the syntax tree's numbers: red team 29 hid two lines that run)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _line_table(text: str) -> tuple:
    """(lines_of(text), the index where each line starts, then the text's length)."""
    lines, starts = lines_of(text), [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return lines, starts


def _offset(lines: list, starts: list, lineno: int, col_bytes: int) -> int:
    """A syntax tree position (1-based line, UTF-8 byte column) as an index into the text."""
    return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col_bytes].decode(errors="ignore"))


def split_source(text: str) -> dict:
    """{"KERNELS": device source, "BINDING": torch layer, "python": the rest, each device string's assignment replaced
    by a placeholder and nothing else of its lines (red team 29: a statement after the string on its closing line
    was cut from the diff with it)."""
    lines, starts = _line_table(text)
    parts = {name: "" for name in DEVICE_STRINGS}
    tree = ast.parse(text)
    # NOTES: only a name bound once in the whole module, by a top-level assignment of one target, becomes a
    # placeholder; every other binding of it stays in the python text (red team 30: a first KERNELS ran as code, a
    # second, a decoy, was the one diffed).
    bound = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    spans = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and bound.count(name := node.targets[0].id) == 1:
            parts[name] = node.value.value
            spans.append((_offset(lines, starts, node.lineno, node.col_offset),
                          _offset(lines, starts, node.end_lineno, node.end_col_offset), name))
    python, position = [], 0
    for start, end, name in sorted(spans):
        python += [text[position:start], f"{name} = \"<device source, diffed on its own>\""]
        position = end
    parts["python"] = "".join(python + [text[position:]])
    return parts


# NOTES: linear in the text: a parameter list nests one level of parentheses at most and stays off `;{}`, a return
# type is at most 8 words, a template's list stays on its line (red team 29: `[^;{]*` across lines made 1.25 MB of
# "a b(" lines take hours). __launch_bounds__(...) is an attribute, not the function's name.
_DEVICE_FUNCTION = re.compile(r"^(?:template[ \t]*<[^<>;{}\n]*>\s*)?"
                              r"(?:(?:__launch_bounds__\([^()\n]*\)|[\w:<>*&,]+)[ \t\n]+){1,8}?"
                              r"\**(\w+)[ \t]*\((?:[^;{}()]|\([^;{}()]*\))*\)\s*(?:const\s*)?\{", re.MULTILINE)
RENAME_BODY_CHARS = 1 << 16  # bodies compared for renames (difflib's ratio grows with the square of the length)
RENAME_PAIRS = 10_000  # (gone, new) function pairs compared at most
RENAME_TOTAL_CHARS = 4 << 20  # bodies kept for comparing, over a source
CODE_DIFF_S = 60.0  # diff.py's code delta at most (code_diff_within)


def functions(source: str, device: bool) -> dict:
    """name -> body text (for rename matching), or None for a body too long to compare (RENAME_BODY_CHARS, or past
    RENAME_TOTAL_CHARS in all): top-level functions and kernels of a device source, functions and classes of Python
    (methods count as Class.method), each body as written (ast.unparse recursed past Python's limit on a long sum:
    red team 29). One pass over the text for all of them, however many there are or however nested."""
    spans = {}
    if not device:
        lines, starts = _line_table(source)
        for node in ast.walk(ast.parse(source)) if source.strip() else []:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = _offset(lines, starts, node.lineno, node.col_offset)
                line_end = source.find("\n", start)  # the body starts on the line after the def's first
                spans[node.name] = (len(source) if line_end < 0 else line_end + 1,
                                    _offset(lines, starts, node.end_lineno, node.end_col_offset))
    else:
        closing, opened = {}, []
        for at, char in enumerate(source):  # each "{" and its "}", found once; one never closed ends no function
            if char == "{":
                opened.append(at)
            elif char == "}" and opened:
                closing[opened.pop()] = at
        spans = {m[1]: (m.end(), closing[m.end() - 1]) for m in _DEVICE_FUNCTION.finditer(source)
                 if m.end() - 1 in closing}
    found, kept = {}, 0
    for name, (start, end) in spans.items():
        fits = end - start <= RENAME_BODY_CHARS and kept + end - start <= RENAME_TOTAL_CHARS
        kept += (end - start) if fits else 0
        found[name] = source[start:end] if fits else None
    return found


def renames(old: dict, new: dict) -> list:
    """[(old name, new name, similarity)] for functions gone from `old` whose body reappears under a new name."""
    gone = [n for n in old if n not in new]
    came = [n for n in new if n not in old]
    found = []
    if len(gone) * len(came) > RENAME_PAIRS:  # each pair is a difflib ratio: past this, no rename is looked for
        return found
    for name in gone:
        scored = [(difflib.SequenceMatcher(None, old[name].replace(name, "#"), new[c].replace(c, "#")).ratio(), c)
                  for c in came if old[name] is not None and new[c] is not None]
        if scored:
            score, best = max(scored)
            if score >= RENAME_SIMILARITY:
                found.append((name, best, score))
                came.remove(best)
    return found


@dataclasses.dataclass
class SectionDiff:
    section: str
    added: int
    removed: int
    unified: str
    renamed: list


def code_diff_within(path_a: Path, path_b: Path, seconds: float = CODE_DIFF_S) -> Optional[list]:
    """code_diff, or None past `seconds` (diff.py then times without it: every red team round so far found another
    input that made some step of it slow). The limit is a SIGALRM, so only in the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return code_diff(path_a, path_b)

    def over(*_):
        raise TimeoutError
    before = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return code_diff(path_a, path_b)
    except TimeoutError:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def code_diff(path_a: Path, path_b: Path) -> list:
    """One SectionDiff per part (KERNELS, BINDING, python), its text shown as `shown` writes it."""
    a, b = split_source(read_source(path_a)), split_source(read_source(path_b))
    out = []
    for section in DEVICE_STRINGS + ("python",):
        lines = list(difflib.unified_diff(lines_of(a[section]), lines_of(b[section]),
                                          fromfile=f"{path_a.stem}:{section}", tofile=f"{path_b.stem}:{section}"))
        body = [line for line in lines if not line.startswith(("---", "+++"))]
        device = section != "python"
        out.append(SectionDiff(section, sum(1 for line in body if line.startswith("+")),
                               sum(1 for line in body if line.startswith("-")),
                               wire.lines_shown("".join(line if line.endswith("\n") else line + "\n" for line in lines)),
                               renames(functions(a[section], device), functions(b[section], device))))
    return out


def code_summary(diffs: list) -> str:
    lines = []
    for diff in diffs:
        moved = "; ".join(f"renamed {old} -> {new} ({score:.0%} alike)" for old, new, score in diff.renamed)
        lines.append(f"{diff.section}: +{diff.added} -{diff.removed} lines" + (f"; {moved}" if moved else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------------------------


def ratio_interval(a_rounds: list, b_rounds: list, confidence: float) -> tuple[float, float, float]:
    """(B/A, low, high): per round the ratio of the two versions' values (the same round, so the same machine
    state), the geometric mean over rounds with a Student-t interval on the log ratios (rounds are the independent
    unit)."""
    from scipy import stats

    logs = [math.log(b / a) for a, b in zip(a_rounds, b_rounds) if a > 0 and b > 0]  # NaN compares False
    if not logs:
        return math.nan, math.nan, math.nan
    mean = sum(logs) / len(logs)
    spread = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    half = stats.t.ppf(0.5 + confidence / 2, len(logs) - 1) * spread if len(logs) > 1 else float("inf")
    return iv.bounded_exp(mean), iv.bounded_exp(mean - half), iv.bounded_exp(mean + half)


def verdict(ratio: float, shown: tuple, decisive: tuple) -> str:
    """`shown`: the 95% interval (reported); `decisive`: the family-wise interval the verdict rests on."""
    spread = 100 * (shown[1] - shown[0]) / 2
    if decisive[0] > 1 and ratio - 1 >= MIN_EFFECT:
        return f"B slower by {100 * (ratio - 1):.1f}% (±{spread:.1f})"
    if decisive[1] < 1 and 1 - ratio >= MIN_EFFECT:
        return f"B faster by {100 * (1 - ratio):.1f}% (±{spread:.1f})"
    return "no difference within noise"


TIMINGS = (("the owner's step (ranks)", "owner"), ("call time (the rank's)", "call"), ("device time, stream held (the rank's)", "held"))
# A rank's own figures are shown beside the owner's, never judged (red team 52: a rank that wrote its call time as
# 1 µs read "B faster by 100.0% (±0.0)").
RANKS_WORD = "no verdict: the rank's own figure"


def compare(run, cases: list, alpha: float = FAMILY_ALPHA) -> list:
    """One row per (case, timing) from a clock run of the entries "A" and "B": their figures, B/A per round with its
    95% interval, the verdict at a family-wise error rate of `alpha` over all verdicts of the run (Bonferroni); or
    the failure that kept a case from being timed."""
    from a2a.rows import shape_label

    timed = {(i, metric) for i in range(len(cases)) for _, metric in TIMINGS
             if all(any(metric in v for v in run.samples.get((key, i), {}).values()) for key in "AB")}
    verdicts = max(1, sum(metric == "owner" for _, metric in timed))
    rows = []
    for i, args in enumerate(cases):
        shape = shape_label(**args)
        for timing, metric in TIMINGS:
            if any(key in run.failed for key in "AB"):
                rows.append({"shape": shape, "timing": timing, "verdict": "not timed: " + "; ".join(
                    f"{key} fails: {wire.as_text(run.failed[key], 160)}" for key in "AB" if key in run.failed)})
                continue
            if (i, metric) not in timed:
                continue
            a, b = (run.samples[(key, i)] for key in "AB")
            common = sorted(r for r in a if r in b and metric in a[r] and metric in b[r])
            a_rounds, b_rounds = [a[r][metric] for r in common], [b[r][metric] for r in common]
            ratio, low, high = ratio_interval(a_rounds, b_rounds, 0.95)
            _, strict_low, strict_high = ratio_interval(a_rounds, b_rounds, 1 - alpha / verdicts)
            rows.append({"shape": shape, "timing": timing, "A µs": statistics.fmean(a_rounds),
                         "B µs": statistics.fmean(b_rounds), "B/A": ratio, "95% low": low, "95% high": high,
                         "rounds": len(common),
                         "verdict": verdict(ratio, (low, high), (strict_low, strict_high)) if metric == "owner"
                         else RANKS_WORD})
    return rows


def time_versions(plan, rounds: int, steps: int, alpha: float = FAMILY_ALPHA, progress=print) -> list:
    """Times the plan's two versions (A, B) on its cases by the judge's clock (a2a/clock.py: fresh processes for
    each in every round, in an order shuffled per round, `rounds` rounds of `steps` steps of each kind per
    visit); one row per (case, timing)."""
    from a2a import clock

    path_a, path_b = plan.versions
    entries = [clock.Entry("A", "version", str(path_a)), clock.Entry("B", "version", str(path_b))]
    settings = clock.Settings(steps=steps, min_rounds=rounds, max_rounds=rounds, time_cap_s=math.inf,
                              targets=())
    return compare(clock.time_entries(plan, entries, settings, progress), plan.case_args, alpha)


def ratio_png(rows: list, meta: dict, path: Path) -> Path:
    from a2a.plots import pyplot

    plt = pyplot()

    timed = [r for r in rows if "B/A" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 * len(shapes) + 3, 4))
    for offset, (timing, _), color in zip((-0.2, 0.0, 0.2), TIMINGS, ("tab:blue", "tab:cyan", "tab:orange")):
        points = [(shapes.index(r["shape"]) + offset, r) for r in timed if r["timing"] == timing]
        if points:
            ax.errorbar([x for x, _ in points], [r["B/A"] for _, r in points],
                        yerr=[[r["B/A"] - r["95% low"] for _, r in points], [r["95% high"] - r["B/A"] for _, r in points]],
                        fmt="o", color=color, capsize=4, label=timing)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel(f"time {meta['b']} / time {meta['a']} (95% interval)")
    ax.set_title(f"{meta['b']} vs {meta['a']}: {meta['device']}, {meta['placement']}, {meta['date']}",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def last_commit(path: Path) -> str:
    """The commit that last changed `path` (A2A_COMMIT's value where there is no .git)."""
    import os
    import subprocess

    from a2a.plan import judges_git

    try:
        said = judges_git("log", "-1", "--format=%h", "--", str(path)).stdout.decode("utf-8", "replace").strip()
    except (OSError, subprocess.SubprocessError):
        said = ""
    return said or os.environ.get("A2A_COMMIT", "unknown")
