"""The result of one drill and the table ``manage.py drills`` prints."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class DrillResult:
    """One drill's outcome. ``recovery_s``: per trial, seconds from the fault to recovery (the drill says
    what recovery means); ``lost``/``stuck``: replies, summed over trials; ``failures``: broken guarantees
    in words (empty when the drill held)."""

    name: str
    trials: int = 0
    recovery_s: list[float] = field(default_factory=list)
    lost: int = 0
    stuck: int = 0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return not self.failures and self.lost == 0 and self.stuck == 0

    def recovery_text(self) -> str:
        if not self.recovery_s:
            return "-"
        values = sorted(self.recovery_s)
        return f"{statistics.median(values):.1f} [{values[0]:.1f}-{values[-1]:.1f}]"


def format_table(results: list[DrillResult]) -> str:
    """A Markdown table: drill | trials | time to recovery s (median [min-max]) | lost | stuck | held."""
    lines = [
        "| drill | trials | time to recovery s, median [min-max] | replies lost | replies stuck | held |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        held = "yes" if r.held else "NO: " + "; ".join(r.failures or ["replies lost or stuck"])
        lines.append(f"| {r.name} | {r.trials} | {r.recovery_text()} | {r.lost} | {r.stuck} | {held} |")
    notes = [f"- {r.name}: {note}" for r in results for note in r.notes]
    return "\n".join(lines + ([""] + notes if notes else []))
