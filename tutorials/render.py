"""Render lessons, with their outputs and figures, into notebooks and HTML pages.

    python -m tutorials.render                 every lesson, full mode, into tutorials/_build/
    python -m tutorials.render 01 03 --quick   some lessons, quick mode
    python -m tutorials.render --out DIR       somewhere else

Each lesson runs in its own Python process (lesson 6 chooses numba's CUDA simulator, which is
fixed once per process), cell after cell in one namespace, as Jupyter would run it.  After
each code cell the printed text and every open matplotlib figure (as PNG) become the cell's
outputs.  The result is written twice: ``NN_name.ipynb`` (nbformat 4, opens in Jupyter, VS Code
or GitHub with the outputs in place) and ``NN_name.html`` (one self-contained page: figures
inlined, no scripts, no network).  A cell that raises stops the lesson; its traceback is kept in
the outputs and the command exits non-zero.

Why a small executor of our own and not jupytext + nbclient: the percent format is ten lines to
parse, and running cells in one namespace is ``exec``; the Jupyter stack (a kernel process,
ZeroMQ, tornado, nbformat's schema validation) would be a dozen dependencies for CI to install
and one more process boundary to fail.  The notebooks written here are ordinary nbformat-4
files, so jupytext and Jupyter read them as usual.
"""

import argparse
import base64
import contextlib
import html
import io
import json
import os
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "_build")


def lessons():
    """The lesson files, in order: tutorials/NN_*.py."""
    return sorted(f for f in os.listdir(HERE) if re.match(r"\d\d_.*\.py$", f))


def find(key):
    """The lesson file for "3", "03" or "03_im2col.py"."""
    for f in lessons():
        if f == key or f[:2] == key.zfill(2):
            return f
    raise SystemExit(f"error: no lesson '{key}'; lessons: {', '.join(lessons())}")


# -- percent format --------------------------------------------------------------------------------
def cells(text):
    """[(kind, source, first line)] of a percent-format script: kind is "code" or "markdown";
    a markdown cell's lines lose their leading "# "."""
    out, kind, buf, start = [], "code", [], 1
    lines = text.splitlines()

    def flush():
        src = "\n".join(buf).strip("\n")
        if src.strip():
            if kind == "markdown":
                src = "\n".join(re.sub(r"^# ?", "", line) for line in src.splitlines())
            out.append((kind, src, start))

    for n, line in enumerate(lines, 1):
        if line.startswith("# %%"):
            flush()
            kind = "markdown" if "[markdown]" in line else "code"
            buf, start = [], n + 1
        else:
            buf.append(line)
    flush()
    return out


# -- running -----------------------------------------------------------------------------------------
def _figures():
    """Every open matplotlib figure as PNG bytes; the figures are closed."""
    import matplotlib.pyplot as plt

    pngs = []
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        pngs.append(buf.getvalue())
        plt.close(fig)
    return pngs


def execute(path):
    """Run the lesson at ``path`` cell by cell in this process; returns (cells with outputs, ok)."""
    for p in (ROOT, HERE):
        if p not in sys.path:
            sys.path.insert(0, p)
    with open(path) as f:
        parsed = cells(f.read())
    namespace = {"__name__": "__main__", "__file__": path}
    result, ok, count = [], True, 0
    for kind, src, start in parsed:
        if kind == "markdown" or not ok:
            result.append({"kind": kind, "source": src, "outputs": []})
            continue
        count += 1
        out = io.StringIO()
        t0 = time.perf_counter()
        try:
            code = compile("\n" * (start - 1) + src, path, "exec")
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(code, namespace)
        except BaseException:  # noqa: BLE001  (shown in the notebook, then the run fails)
            ok = False
            out.write(traceback.format_exc())
        outputs = [{"text": out.getvalue()}] if out.getvalue() else []
        outputs += [{"png": png} for png in _figures()]
        result.append({"kind": kind, "source": src, "outputs": outputs, "count": count})
        print(f"  cell {count:2d} (line {start:4d}) {time.perf_counter() - t0:6.2f} s", file=sys.stderr)
    return result, ok


# -- writing -------------------------------------------------------------------------------------------
def _lines(text):
    return text.splitlines(keepends=True)


def notebook(result):
    """An nbformat 4.5 notebook (dict) of executed cells."""
    nb_cells = []
    for i, c in enumerate(result):
        cell = {"cell_type": c["kind"], "id": f"cell-{i}", "metadata": {}, "source": _lines(c["source"])}
        if c["kind"] == "code":
            outs = []
            for o in c["outputs"]:
                if "text" in o:
                    outs.append({"output_type": "stream", "name": "stdout", "text": _lines(o["text"])})
                else:
                    data = {"image/png": base64.b64encode(o["png"]).decode(), "text/plain": ["<Figure>"]}
                    outs.append({"output_type": "display_data", "data": data, "metadata": {}})
            cell.update(execution_count=c.get("count"), outputs=outs)
        nb_cells.append(cell)
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": sys.version.split()[0]},
        },
        "cells": nb_cells,
    }


def _inline(text):
    """Markdown inline spans -> HTML: `code`, **bold**, *emphasis*, [text](link)."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) > 1:
            out.append(f"<code>{html.escape(p[1:-1])}</code>")
            continue
        p = html.escape(p, quote=False)
        p = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", p)
        p = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", p)
        p = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', p)
        out.append(p)
    return "".join(out)


def markdown_html(src):
    """The Markdown the lessons use -> HTML: headings, paragraphs, lists, fenced code, tables."""
    out, para, lines, i = [], [], src.splitlines(), 0

    def end_para():
        if para:
            out.append("<p>" + _inline(" ".join(para)) + "</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            end_para()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1 : j])) + "</code></pre>")
            i = j + 1
            continue
        m = re.match(r"(#{1,6})\s+(.*)", s)
        if m:
            end_para()
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif s.startswith("|"):
            end_para()
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells_ = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells_):
                    rows.append(cells_)
                i += 1
            body = "".join(
                "<tr>"
                + "".join(f"<{'th' if r == 0 else 'td'}>{_inline(c)}</{'th' if r == 0 else 'td'}>" for c in row)
                + "</tr>"
                for r, row in enumerate(rows)
            )
            out.append(f"<table>{body}</table>")
            continue
        elif re.match(r"([-*]|\d+\.)\s", s):
            end_para()
            tag = "ol" if s[0].isdigit() else "ul"
            items = []
            while i < len(lines) and lines[i].strip():
                t = lines[i].strip()
                if re.match(r"([-*]|\d+\.)\s", t):
                    items.append(re.sub(r"^([-*]|\d+\.)\s+", "", t))
                else:
                    items[-1] += " " + t
                i += 1
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(t)}</li>" for t in items) + f"</{tag}>")
            continue
        elif not s:
            end_para()
        else:
            para.append(s)
        i += 1
    end_para()
    return "\n".join(out)


CSS = """body{max-width:56rem;margin:2rem auto;padding:0 1rem;font:16px/1.55 system-ui,sans-serif;color:#222}
pre{background:#f6f8fa;padding:.6rem .8rem;overflow-x:auto;font-size:13px;border-radius:4px}
pre.out{background:#fff;border-left:3px solid #ccd;white-space:pre-wrap}
code{font-size:90%}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem}
img{max-width:100%}.cell{margin:.8rem 0}.n{color:#889;font-size:12px}"""


def page(title, result):
    """One self-contained HTML page of executed cells."""
    body = []
    for c in result:
        if c["kind"] == "markdown":
            body.append(f'<div class="cell md">{markdown_html(c["source"])}</div>')
            continue
        parts = [f'<div class="n">In [{c.get("count", " ")}]:</div><pre><code>{html.escape(c["source"])}</code></pre>']
        for o in c["outputs"]:
            if "text" in o:
                parts.append(f'<pre class="out">{html.escape(o["text"])}</pre>')
            else:
                parts.append(f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(o["png"]).decode()}">')
        body.append('<div class="cell code">' + "".join(parts) + "</div>")
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def render_one(lesson, out_dir):
    """Execute one lesson (in this process) and write its .ipynb and .html; returns ok."""
    os.environ["MINICAFFE_TUTORIAL_RENDER"] = "1"  # lessons leave figures open for us to collect
    os.environ.setdefault("MPLBACKEND", "Agg")
    result, ok = execute(os.path.join(HERE, lesson))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, lesson[:-3])
    with open(stem + ".ipynb", "w") as f:
        json.dump(notebook(result), f, indent=1)
        f.write("\n")
    with open(stem + ".html", "w") as f:
        f.write(page(lesson[:-3], result))
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tutorials.render", description=__doc__.split("\n\n")[0])
    ap.add_argument("lessons", nargs="*", help="lesson numbers or file names (default: all)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default tutorials/_build)")
    ap.add_argument("--quick", action="store_true", help="quick mode: small sizes, as the tests run them")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: render this lesson here
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.one:
        return 0 if render_one(args.one, out) else 1
    env = dict(os.environ, MINICAFFE_TUTORIAL_FIGURES=os.path.join(out, "figures"))
    if args.quick:
        env["MINICAFFE_TUTORIAL_QUICK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    failed = []
    for lesson in [find(k) for k in args.lessons] or lessons():
        t0 = time.perf_counter()
        print(f"{lesson} ...", flush=True)
        rc = subprocess.call(
            [sys.executable, "-m", "tutorials.render", "--one", lesson, "--out", out], cwd=ROOT, env=env
        )
        status = "ok" if rc == 0 else "FAILED (the traceback is in the notebook)"
        print(f"{lesson}: {status}, {time.perf_counter() - t0:.1f} s -> {os.path.join(out, lesson[:-3])}.ipynb/.html")
        if rc:
            failed.append(lesson)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
