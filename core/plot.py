"""``delegate plan --svg``: the graph laid out by dependency level, ops coloured by backend.

Edges that cross devices (copies) are drawn dashed red, so where a plan pays
for transfers is visible at a glance.  Plain SVG text: no plotting library needed.
"""

from __future__ import annotations

from html import escape

import networkx as nx

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7"]
CPU_COLOUR = "#bab0ac"
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 150, 34, 24, 26, 20
MAX_PER_ROW = 8


def plan_svg(plan) -> str:
    graph = plan.graph
    backend_of = {d.index: d.backend for d in plan.decisions}
    part_of = {i: p.index for p in plan.partitions for i in p.op_indices}
    colours = {plan.host: CPU_COLOUR}
    for name in sorted({p.backend for p in plan.partitions} - {plan.host}):
        colours[name] = PALETTE[(len(colours) - 1) % len(PALETTE)]

    dag = nx.DiGraph()
    dag.add_nodes_from(op.index for op in graph.ops)
    for op in graph.ops:
        for t in op.inputs:
            if t is not None and t.producer is not None:
                dag.add_edge(t.producer.index, op.index, tensor=t)
    # lay out by level; wide levels wrap onto extra rows
    position, row = {}, 0
    for level in nx.topological_generations(dag):
        level = sorted(level)
        for start in range(0, len(level), MAX_PER_ROW):
            for col, node in enumerate(level[start:start + MAX_PER_ROW]):
                position[node] = (MARGIN + col * (BOX_W + GAP_X), MARGIN + 40 + row * (BOX_H + GAP_Y))
            row += 1
    columns = max((x for x, _ in position.values()), default=MARGIN) + BOX_W + GAP_X
    width = max(columns + MARGIN, 560)
    height = MARGIN * 2 + 60 + row * (BOX_H + GAP_Y)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{MARGIN}" y="{MARGIN + 12}" font-size="13">{escape(plan.summary())}; '
           f'{len(plan.copies)} copies, estimated {plan.estimated_ms:.3f} ms</text>']
    x = MARGIN
    for name, colour in colours.items():
        out.append(f'<rect x="{x}" y="{MARGIN + 20}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{x + 16}" y="{MARGIN + 30}">{escape(name)}</text>')
        x += 110
    for u, v in dag.edges:
        (x1, y1), (x2, y2) = position[u], position[v]
        crossing = backend_of[u] != backend_of[v]
        style = 'stroke="#d62728" stroke-dasharray="4 3" stroke-width="2"' if crossing else 'stroke="#888"'
        out.append(f'<line x1="{x1 + BOX_W / 2}" y1="{y1 + BOX_H}" x2="{x2 + BOX_W / 2}" y2="{y2}" {style}/>')
    for op in graph.ops:
        x, y = position[op.index]
        colour = colours.get(backend_of[op.index], CPU_COLOUR)
        label = escape(f"#{op.index} {op.opcode}")[:28]
        out.append(f'<g><title>{escape(op.describe())} on {escape(backend_of[op.index])}, '
                   f'partition {part_of[op.index]}</title>'
                   f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="{colour}" stroke="#333"/>'
                   f'<text x="{x + 6}" y="{y + 14}">{label}</text>'
                   f'<text x="{x + 6}" y="{y + 27}" fill="#222">P{part_of[op.index]} '
                   f'{escape(backend_of[op.index])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
