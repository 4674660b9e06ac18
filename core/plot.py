"""``delegate plan --svg``: the plan drawn by Graphviz's ``dot``, one box per partition, ops coloured by backend.

Ops whose inputs are all constants (a weight's DEQUANTIZE) are folded into the op that reads them, so
a quantized model shows its computation rather than a wall of weight conversions.  Values that cross
devices (copies) are drawn dashed red, as the legend under the title says.  ``dot`` lays the graph
out by dependency levels, which hand placement did badly on real models; its SVG is scaled down to
a width a screen shows (it stays a vector picture to zoom into).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html import escape

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7"]
CPU_COLOUR = "#bab0ac"
COPY_COLOUR = "#d62728"
MAX_WIDTH_PX = 1600
LABEL_CHARS = 22  # op codes longer than this are cut, so every box keeps the width of its neighbours
DOT_TIMEOUT_S = 120


def dot_missing() -> str | None:
    """Why ``plan --svg`` cannot draw here (checked before the run), None when it can."""
    if shutil.which("dot") is None:
        return "drawing needs Graphviz's dot program on PATH (Debian/Ubuntu: apt-get install graphviz)"
    return None


def backend_colours(plan) -> dict[str, str]:
    """A colour per backend running a partition: the host grey, the others from the palette in name order."""
    used = {p.backend for p in plan.partitions}
    colours = {plan.host: CPU_COLOUR} if plan.host in used else {}
    for i, name in enumerate(sorted(used - {plan.host})):
        colours[name] = PALETTE[i % len(PALETTE)]
    return colours


def folded_ops(graph) -> set[int]:
    """Ops computed from constants alone (and not read as a model output): drawn inside their consumers."""
    outputs = {t.index for t in graph.outputs}
    folded: set[int] = set()
    for op in graph.ops:  # in order: a constant chain folds whole
        if all(t is None or t.is_constant or (t.producer is not None and t.producer.index in folded)
               for t in op.inputs) and not any(t.index in outputs for t in op.outputs):
            folded.add(op.index)
    return folded


def _short(text: str, most: int = LABEL_CHARS) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


def plan_dot(plan) -> str:
    """The plan as Graphviz DOT text: partitions as clusters, runs of ops one after another in one partition as
    one box (the ops listed in its tooltip), model inputs and outputs as plain nodes."""
    graph = plan.graph
    colours = backend_colours(plan)
    backend_of = {d.index: d.backend for d in plan.decisions}
    part_of = {i: p.index for p in plan.partitions for i in p.op_indices}
    folded = folded_ops(graph)
    inside: dict[int, list[str]] = {}  # consumer -> the folded ops it reads
    for op in graph.ops:
        if op.index in folded:
            continue
        for t in op.inputs:
            if t is not None and t.producer is not None and t.producer.index in folded:
                inside.setdefault(op.index, []).append(t.producer.opcode)
    model_inputs, model_outputs = {t.index for t in graph.inputs}, {t.index for t in graph.outputs}
    edges: dict[tuple[str, str], bool] = {}  # (from, to) -> a copy between devices
    for op in graph.ops:
        if op.index in folded:
            continue
        for t in op.inputs:
            if t is None or t.is_constant or (t.producer is not None and t.producer.index in folded) or (
                    t.producer is None and t.index not in model_inputs):  # a variable tensor: state, not data flow
                continue
            source, where = (f"op{t.producer.index}", backend_of[t.producer.index]) if t.producer is not None \
                else (f"in{t.index}", plan.host)
            key = (source, f"op{op.index}")
            edges[key] = edges.get(key, False) or where != backend_of[op.index]
    for t in graph.outputs:
        if t.producer is not None:
            edges[(f"op{t.producer.index}", f"out{t.index}")] = backend_of[t.producer.index] != plan.host
    box = _chains(graph, folded, edges, part_of, model_outputs)
    lines = ["digraph plan {", 'graph [rankdir=TB, labelloc=t, labeljust=l, fontname="Helvetica", nodesep=0.25, '
             f'ranksep=0.3, tooltip="plan", label=<{_title(plan, colours, len(folded))}>];',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, height=0.3, '
             'margin="0.08,0.03"];', 'edge [color="#777777", arrowsize=0.6];']
    members: dict[str, list] = {}
    for op in graph.ops:
        if op.index not in folded:
            members.setdefault(box[f"op{op.index}"], []).append(op)
    for p in plan.partitions:
        names = [name for name, ops in members.items() if part_of[ops[0].index] == p.index]
        if not names:
            continue
        lines.append(f'subgraph cluster_p{p.index} {{ label="P{p.index} · {p.backend} · {len(p.ops)} ops"; '
                     f'style="rounded,dashed"; color="{colours[p.backend]}"; fontsize=11;')
        text = "black" if p.backend == plan.host else "white"
        for name in names:
            lines.append(f'  {name} [label=<{_box_label(members[name], inside)}>, fillcolor="{colours[p.backend]}", '
                         f'fontcolor="{text}", tooltip="{_box_tip(members[name], p)}"];')
        lines.append("}")
    for t in graph.inputs:
        lines.append(f'in{t.index} [shape=plaintext, style="", label="{escape(_short(t.name, 30))}\\n'
                     f'{list(t.shape)}", tooltip="model input"];')
    for t in graph.outputs:
        lines.append(f'out{t.index} [shape=plaintext, style="", label="{escape(_short(t.name, 30))}\\n'
                     f'{list(t.shape)}", tooltip="model output"];')
    drawn: dict[tuple[str, str], bool] = {}
    for (u, v), crossing in edges.items():
        u, v = box.get(u, u), box.get(v, v)
        if u != v:
            drawn[(u, v)] = drawn.get((u, v), False) or crossing
    for (u, v), crossing in drawn.items():
        style = f' [color="{COPY_COLOUR}", style=dashed, penwidth=1.8]' if crossing else ""
        lines.append(f"{u} -> {v}{style};")
    lines.append("}")
    return "\n".join(lines)


def _chains(graph, folded, edges, part_of, model_outputs) -> dict[str, str]:
    """Op node -> the box it is drawn in: an op whose only drawn input comes from the op before it, in the same
    partition, where that op feeds nothing else (and no model output), joins that op's box."""
    preds: dict[str, set[str]] = {}
    succs: dict[str, set[str]] = {}
    for u, v in edges:
        preds.setdefault(v, set()).add(u)
        succs.setdefault(u, set()).add(v)
    box: dict[str, str] = {}
    for op in graph.ops:
        name = f"op{op.index}"
        if op.index in folded:
            continue
        before = preds.get(name, set())
        if len(before) == 1:
            (u,) = before
            if u.startswith("op") and succs.get(u) == {name} and part_of[int(u[2:])] == part_of[op.index]:
                box[name] = box[u]
                continue
        box[name] = name
    return box


def _box_label(ops: list, inside: dict[int, list[str]]) -> str:
    """One op: ``#3 CONV_2D``; a run of them: its first and last op over the kinds it holds; + the folded ops."""
    first, last = ops[0], ops[-1]
    label = escape(f"#{first.index} {_short(first.opcode)}")
    small = []
    if len(ops) > 1:
        label += escape(f" … #{last.index} {_short(last.opcode)}")
        small.append(f"{len(ops)} ops: {_kinds([op.opcode for op in ops])}")
    extra = [code for op in ops for code in inside.get(op.index, [])]
    if extra:
        small.append(f"+ {_kinds(extra)} on weights")
    for line in small:
        label += f'<br/><font point-size="8">{escape(_short(line, 2 * LABEL_CHARS))}</font>'
    return label


def _box_tip(ops: list, partition) -> str:
    text = "; ".join(op.describe() for op in ops[:12]) + (f"; and {len(ops) - 12} more" if len(ops) > 12 else "")
    return escape(f"{text} (on {partition.backend}, partition {partition.index})", quote=True)


def _kinds(opcodes: list[str]) -> str:
    counts: dict[str, int] = {}
    for code in opcodes:
        counts[code] = counts.get(code, 0) + 1
    return ", ".join(code if n == 1 else f"{n} {code}" for code, n in counts.items())


def _title(plan, colours: dict[str, str], folded: int) -> str:
    """The title (the plan in one line) over the legend: a swatch per backend and the copies' line style."""
    swatches = "".join(f'<font color="{c}">■</font> {escape(name)}     ' for name, c in colours.items())
    note = f"; {folded} ops on constants folded into their consumers" if folded else ""
    return (f'<table border="0" cellspacing="2" cellpadding="1">'
            f'<tr><td align="left"><font point-size="14">{escape(plan.summary())}</font></td></tr>'
            f'<tr><td align="left">{len(plan.partitions)} partition(s) (dashed boxes), {len(plan.copies)} copies, '
            f'estimated {plan.estimated_ms:.3f} ms{escape(note)}</td></tr>'
            f'<tr><td align="left">{swatches}<font color="{COPY_COLOUR}">- - - a copy between devices</font>'
            f'</td></tr></table>')


def plan_svg(plan) -> str:
    """The plan drawn by ``dot``, its width capped at MAX_WIDTH_PX (the height scaled alike)."""
    why = dot_missing()
    if why:
        raise RuntimeError(why)
    svg = subprocess.run(["dot", "-Tsvg"], input=plan_dot(plan), capture_output=True, text=True, check=True,
                         timeout=DOT_TIMEOUT_S).stdout
    return fit_width(svg, MAX_WIDTH_PX)


def fit_width(svg: str, most_px: float) -> str:
    """Scale the root element's width and height (the viewBox keeps the drawing) to at most ``most_px`` wide."""
    match = re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    if not match:
        return svg
    width, height = (float(v) * 4 / 3 for v in match.groups())  # points to CSS pixels
    scale = min(1.0, most_px / width)
    return svg.replace(match.group(0), f'<svg width="{width * scale:.0f}px" height="{height * scale:.0f}px"', 1)
