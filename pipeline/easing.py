"""The Hermite ``smoothstep`` for plain numbers and torch tensors alike: its one definition here."""

from __future__ import annotations

from typing import Any, overload

import torch


@overload
def smoothstep(edge0: float, edge1: float, x: float) -> float: ...


@overload
def smoothstep(
    edge0: float | torch.Tensor,
    edge1: float | torch.Tensor,
    x: torch.Tensor,
    *,
    min_width: float | None = ...,
) -> torch.Tensor: ...


def smoothstep(edge0: Any, edge1: Any, x: Any, *, min_width: float | None = None) -> Any:
    """0 at ``edge0``, 1 at ``edge1`` (either order for numbers), ``3t^2 - 2t^3`` between.

    Tensors broadcast (edges may be tensors too); ``min_width`` floors ``edge1 - edge0`` for tensor edges
    that may meet (it then requires ``edge1 > edge0``).
    """
    width = edge1 - edge0
    if min_width is not None:
        width = width.clamp(min=min_width) if isinstance(width, torch.Tensor) else max(width, min_width)
    t = (x - edge0) / width
    t = t.clamp(0.0, 1.0) if isinstance(t, torch.Tensor) else min(1.0, max(0.0, t))
    return t * t * (3.0 - 2.0 * t)
