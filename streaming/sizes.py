"""Output sizes: what a caller or viewer asks for (``"1280x720"``, or a width and a height), checked
against the server's cap, and where an avatar's frame lies inside a picture of that size.

A session's video leaves at one size for its whole life (its own encoder's), chosen at signalling: the JSON
``size`` (or ``width`` and ``height``) of ``POST /offer``, the ``size`` (or ``width`` and ``height``) query of
WHIP and WHEP. Without one the avatar's own size is used (fitted into the cap when it is larger). An avatar
frame of another aspect is scaled to fit, centred, on black (:func:`placement`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MIN_SIDE_PX = 16
# The hard ceiling, whatever --max-output-size says: H.264 level 4.0 and the 4:2:0 planes' layout hold up to
# 1920x1088; the lip-sync pipeline is measured to 1920x1080 (docs/performance.md).
MAX_SIDE_PX = 1920
DEFAULT_MAX_OUTPUT_SIZE = "1920x1080"
SIZE_PATTERN = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")


class SizeError(ValueError):
    """A size that is malformed or above the cap; the message names the field."""


@dataclass(frozen=True, order=True)
class OutputSize:
    width: int
    height: int

    def __post_init__(self) -> None:
        for side, value in (("width", self.width), ("height", self.height)):
            if not MIN_SIDE_PX <= value <= MAX_SIDE_PX:
                raise SizeError(f"{side} must be {MIN_SIDE_PX}..{MAX_SIDE_PX} px, got {value}")
            if value % 2:
                raise SizeError(f"{side} must be even (4:2:0 video), got {value}")

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def fits(self, cap: OutputSize) -> bool:
        """Within ``cap`` either way round (a portrait 720x1280 fits a 1280x720 cap)."""
        long_side, short_side = max(self.width, self.height), min(self.width, self.height)
        return long_side <= max(cap.width, cap.height) and short_side <= min(cap.width, cap.height)

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"

    @classmethod
    def parse(cls, text: str, field: str = "size") -> OutputSize:
        """``"WIDTHxHEIGHT"``; :class:`SizeError` naming ``field`` if it is not one."""
        match = SIZE_PATTERN.match(text) if isinstance(text, str) else None
        if match is None:
            raise SizeError(f"{field} must be WIDTHxHEIGHT (e.g. 1280x720), got {text!r}")
        try:
            return cls(int(match.group(1)), int(match.group(2)))
        except SizeError as e:
            raise SizeError(f"{field}: {e}") from None


def fitted(width: int, height: int, cap: OutputSize) -> OutputSize:
    """``width`` x ``height`` scaled down (never up) to fit ``cap``, keeping the aspect, even sides."""
    long_scale = max(cap.width, cap.height) / max(width, height)
    scale = min(1.0, long_scale, min(cap.width, cap.height) / min(width, height))
    return OutputSize(
        max(MIN_SIDE_PX, int(width * scale) // 2 * 2), max(MIN_SIDE_PX, int(height * scale) // 2 * 2)
    )


def requested_size(fields: dict[str, Any], cap: OutputSize, *, prefix: str = "") -> OutputSize | None:
    """The size a request asks for, from ``size`` or ``width`` and ``height`` (strings from a query, or
    JSON numbers), or None if it asks for none; :class:`SizeError` (naming the field) if it is malformed or
    above ``cap``. ``prefix`` goes before the field names in messages (``"query "``)."""
    size_value = fields.get("size")
    width_value, height_value = fields.get("width"), fields.get("height")
    if size_value is None and width_value is None and height_value is None:
        return None
    if size_value is not None:
        if width_value is not None or height_value is not None:
            raise SizeError(f"give {prefix}'size' or {prefix}'width' and 'height', not both")
        size = OutputSize.parse(size_value, f"{prefix}'size'") if isinstance(size_value, str) else None
        if size is None:
            raise SizeError(f"{prefix}'size' must be a string WIDTHxHEIGHT (e.g. \"1280x720\")")
        field = "size"
    else:
        sides = []
        for name, value in (("width", width_value), ("height", height_value)):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SizeError(f"{prefix}'{name}' must be an integer number of pixels, got {value!r}")
            sides.append(value)
        try:
            size = OutputSize(sides[0], sides[1])
        except SizeError as e:
            raise SizeError(f"{prefix}'width'/'height': {e}") from None
        field = "width"
    if not size.fits(cap):
        raise SizeError(f"{prefix}'{field}' {size} is above this server's maximum output size {cap}")
    return size


@dataclass(frozen=True)
class Placement:
    """Where a ``source`` frame lies in a picture of ``size``: scaled by ``scale`` to ``width`` x ``height``
    at (``top``, ``left``), all even so the 4:2:0 planes split cleanly."""

    size: OutputSize
    scale: float
    top: int
    left: int
    width: int
    height: int

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and (self.width, self.height) == (self.size.width, self.size.height)


def placement(source_width: int, source_height: int, size: OutputSize) -> Placement:
    """``source`` scaled to fit ``size`` keeping its aspect, centred (black bars where the aspects differ)."""
    if (source_width, source_height) == (size.width, size.height):
        return Placement(size, 1.0, 0, 0, size.width, size.height)
    scale = min(size.width / source_width, size.height / source_height)
    width = min(size.width, max(2, round(source_width * scale / 2) * 2))
    height = min(size.height, max(2, round(source_height * scale / 2) * 2))
    top = (size.height - height) // 4 * 2
    left = (size.width - width) // 4 * 2
    return Placement(size, scale, top, left, width, height)
