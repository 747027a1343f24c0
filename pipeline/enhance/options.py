"""What a session may ask of the face post-processing, checked before anything of the call is started.

``face_enhance`` is ``off`` or ``sharpen``; ``face_enhance_strength`` in [0, 1] (default 0.7) weighs the
restorer: output = base + strength * (restored - base). The server's default mode comes from
``--face-enhance``; a session's own choice (the ``/offer`` JSON, the WHIP query) overrides it. No torch here:
the server and the media workers check requests with this alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OFF = "off"
SHARPEN = "sharpen"
FACE_ENHANCE_MODES = (OFF, SHARPEN)
DEFAULT_STRENGTH = 0.7
MODE_FIELD = "face_enhance"
STRENGTH_FIELD = "face_enhance_strength"


class EnhanceOptionError(ValueError):
    """A request's face_enhance value or strength is not one of the allowed ones (a 400)."""


class EnhanceRefusedError(RuntimeError):
    """``sharpen`` was asked for but this server cannot give it (no restorer, or a CPU-only server)."""


@dataclass(frozen=True)
class EnhanceChoice:
    """One session's face post-processing: its mode and strength."""

    mode: str = OFF
    strength: float = DEFAULT_STRENGTH

    @property
    def effective_strength(self) -> float:
        """The weight the engine applies: 0 when off (and at strength 0, which renders exactly as off)."""
        return self.strength if self.mode == SHARPEN else 0.0


def parse_mode(value: object) -> str:
    """A ``face_enhance`` value as given (JSON or query text) -> one of :data:`FACE_ENHANCE_MODES`."""
    if isinstance(value, str) and value.strip().lower() in FACE_ENHANCE_MODES:
        return value.strip().lower()
    raise EnhanceOptionError(f"'{MODE_FIELD}' must be one of {', '.join(FACE_ENHANCE_MODES)}; got {value!r}")


def parse_strength(value: object) -> float:
    """A ``face_enhance_strength`` (a JSON number or query text) -> a float in [0, 1]."""
    allowed = f"'{STRENGTH_FIELD}' must be a number in [0, 1]"
    if isinstance(value, bool):
        raise EnhanceOptionError(f"{allowed}; got {value!r}")
    try:
        strength = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise EnhanceOptionError(f"{allowed}; got {value!r}") from None
    if not math.isfinite(strength) or not 0.0 <= strength <= 1.0:
        raise EnhanceOptionError(f"{allowed}; got {value!r}")
    return strength


def choose(mode: object | None, strength: object | None, default: EnhanceChoice) -> EnhanceChoice:
    """A session's choice: what it gave (None: not given) over the server's ``default``."""
    return EnhanceChoice(
        default.mode if mode is None else parse_mode(mode),
        default.strength if strength is None else parse_strength(strength),
    )


def sharpen_device(backend: object) -> str | None:
    """Where a backend's sharpen stage runs (its ``sharpen_device``), None for a backend without one."""
    device = getattr(backend, "sharpen_device", None)
    return device if isinstance(device, str) else None


@dataclass(frozen=True)
class EnhancePolicy:
    """What this server can give: ``device`` is where the restorer runs (``"cuda"``, ``"cpu"``) or None when
    none is configured; ``allow_cpu``: sharpen on a CPU anyway (``--face-enhance-allow-cpu``)."""

    default: EnhanceChoice = EnhanceChoice()
    device: str | None = None
    allow_cpu: bool = False

    def check(self, choice: EnhanceChoice) -> None:
        """Raise :class:`EnhanceRefusedError` when ``choice`` asks for what this server cannot give."""
        if choice.mode != SHARPEN:
            return
        if self.device is None:
            raise EnhanceRefusedError(
                f"'{MODE_FIELD}': sharpen needs a restorer, and this server has none: start `lipcast serve`"
                " with --face-enhance-weights FILE (docs/sharpen.md), or ask for 'off'"
            )
        if self.device == "cpu" and not self.allow_cpu:
            raise EnhanceRefusedError(
                f"'{MODE_FIELD}': sharpen is refused on this CPU-only server (too slow for a live call);"
                " --face-enhance-allow-cpu allows it anyway"
            )

    def to_json(self) -> dict[str, object]:
        """For ``/healthz``: the default, and whether a call may ask for sharpen here."""
        try:
            self.check(EnhanceChoice(SHARPEN))
            sharpen = True
        except EnhanceRefusedError:
            sharpen = False
        return {"default": self.default.mode, "strength": self.default.strength, "sharpen": sharpen}

    def resolve(self, mode: object | None, strength: object | None) -> EnhanceChoice:
        """Parse and check a session's request; raises :class:`EnhanceOptionError` (bad values) or
        :class:`EnhanceRefusedError` (not available here)."""
        choice = choose(mode, strength, self.default)
        self.check(choice)
        return choice
