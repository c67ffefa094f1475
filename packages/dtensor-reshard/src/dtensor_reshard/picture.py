"""ASCII pictures of a plan: which source boxes feed which destination box (1-D and 2-D)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.layout import Layout
from dtensor_reshard.planner import TransferPlan


def _cuts(boxes: list[Box], dim: int, size: int) -> list[int]:
    cuts = {0, size}
    for box in boxes:
        if box.numel > 0:
            cuts.update((box.offsets[dim], box.ends[dim]))
    return sorted(cuts)


def _grid(rows: list[int], cols: list[int], label: Callable[[Box], str]) -> str:
    """Draws cells between the cuts; a border is drawn only between differently labelled
    cells, so each region (a box) shows as one block, labelled once in its top-left cell."""
    cells = [
        [label(Box((r0, c0), (r1 - r0, c1 - c0))) for c0, c1 in pairwise(cols)]
        for r0, r1 in pairwise(rows)
    ]
    n_rows, n_cols = len(cells), len(cells[0])
    width = max(len(c) for row in cells for c in row) + 2
    row_heads = [f"{r0}:{r1}" for r0, r1 in pairwise(rows)]
    margin = max(len(h) for h in row_heads) + 1

    def at(i: int, j: int) -> str | None:
        return cells[i][j] if 0 <= i < n_rows and 0 <= j < n_cols else None

    def corner(i: int, j: int) -> str:
        # The junction above row i, left of column j, joins up to four border segments.
        horizontal = at(i - 1, j - 1) != at(i, j - 1) or at(i - 1, j) != at(i, j)
        vertical = at(i - 1, j - 1) != at(i - 1, j) or at(i, j - 1) != at(i, j)
        return "+" if horizontal and vertical else "-" if horizontal else "|" if vertical else " "

    lines = [
        " " * (margin + 1) + "".join(f"{c0}:{c1}".center(width + 1) for c0, c1 in pairwise(cols))
    ]
    for i in range(n_rows + 1):
        rule = [corner(i, 0)]
        for j in range(n_cols):
            rule.append(("-" if at(i - 1, j) != at(i, j) else " ") * width + corner(i, j + 1))
        lines.append(" " * margin + "".join(rule).rstrip())
        if i == n_rows:
            break
        text = ["|"]
        for j in range(n_cols):
            first = at(i - 1, j) != cells[i][j] and at(i, j - 1) != cells[i][j]
            text.append((cells[i][j] if first else "").center(width))
            text.append("|" if at(i, j + 1) != cells[i][j] else " ")
        lines.append(row_heads[i].ljust(margin) + "".join(text))
    return "\n".join(line.rstrip() for line in lines)


def _as_2d(box: Box) -> Box:
    return Box((0, *box.offsets), (1, *box.sizes)) if box.ndim == 1 else box


def _holders(layout: Layout, cell: Box) -> list[int]:
    return [r for r in range(layout.num_ranks) if _as_2d(layout.local_box(r)).intersect(cell)]


def render_overlap(p: TransferPlan) -> str:
    """Three grids over the global tensor (rows by columns; a 1-D tensor is one row).

    `source` labels each block with the source ranks holding it, `destination` with the
    destination ranks, and `pieces` with `sX>dY`: destination rank Y reads the block from
    source rank X (`=` instead of `>` for a local piece). Cell edges are the union of both
    layouts' cuts, so each `pieces` cell lies inside one piece.
    """
    shape = p.src.global_shape
    if len(shape) not in (1, 2):
        raise ReshardError(f"render_overlap draws 1-D and 2-D tensors, not shape {shape}")
    rows_n, cols_n = (1, shape[0]) if len(shape) == 1 else shape
    boxes = [
        _as_2d(layout.local_box(r)) for layout in (p.src, p.dst) for r in range(layout.num_ranks)
    ]
    rows, cols = _cuts(boxes, 0, rows_n), _cuts(boxes, 1, cols_n)

    def src_label(cell: Box) -> str:
        return ",".join(f"s{r}" for r in _holders(p.src, cell))

    def dst_label(cell: Box) -> str:
        return ",".join(f"d{r}" for r in _holders(p.dst, cell))

    def piece_label(cell: Box) -> str:
        labels = []
        for dst_rank, pieces in enumerate(p.pieces):
            for piece in pieces:
                if _as_2d(piece.global_box).intersect(cell):
                    arrow = "=" if piece.local else ">"
                    labels.append(f"s{piece.src_rank}{arrow}d{dst_rank}")
        return " ".join(labels)

    return "\n".join(
        [
            f"source       {p.src.describe()}",
            _grid(rows, cols, src_label),
            f"destination  {p.dst.describe()}",
            _grid(rows, cols, dst_label),
            f"pieces       ({p.bytes_moved} bytes move)",
            _grid(rows, cols, piece_label),
        ]
    )
