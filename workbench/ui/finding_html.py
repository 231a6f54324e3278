"""The study's finding as HTML list items, the same words in the report and the Dashboard: each
curve's lead line, its next changes, and its loss table under them
(:class:`workbench.analysis.advice.finding.Finding`); other lines as they are. And a figure's
definition, folded behind a toggle above it."""

from __future__ import annotations

import html
from collections.abc import Sequence

from workbench.analysis.advice.finding import Finding

#: The loss table's look, inline so that it holds in a notebook's output as in the report.
TABLE = "border-collapse: collapse; margin: 0 0 0.2rem 0.6rem; line-height: 1.25;"
CELL = "padding: 0 0.6rem 0 0; text-align: {};"
#: The lines under a curve's lead: smaller, so the lead reads first.
UNDER = "font-size: 0.88em; color: #333;"
DEFINITION = "color: #555; font-size: 0.85em; line-height: 1.35; margin: 0.2rem 0;"


def tone(line: str) -> str:
    """The colour of a finding's line: red for a slowdown or a curve whose largest cause is
    communication, orange for a straggler or an incomplete run, green for a speedup; none
    otherwise (a :class:`Finding` by its lead)."""
    lead = line.lead if isinstance(line, Finding) else line
    if "slower than" in lead or "largest cause: exposed allreduce" in lead:
        return "bad"
    if "straggler" in lead or "incomplete" in lead:
        return "warn"
    return "good" if "faster than" in lead else ""


def _losses_html(finding: Finding) -> str:
    rows = "".join(
        "<tr>"
        f'<td style="{CELL.format("left")}">{html.escape(cause)}</td>'
        f'<td style="{CELL.format("right")}">{html.escape(share)}</td>'
        f'<td style="{CELL.format("left")}">{html.escape(detail)}</td>'
        "</tr>"
        for cause, share, detail in finding.losses
    )
    return (
        f'<div class="losses" style="{UNDER}">{html.escape(finding.heading)}'
        f'<table style="{TABLE}">{rows}</table></div>'
    )


def finding_items(said: Sequence[str]) -> str:
    """``<li>`` items (class: :func:`tone`), one per line of :func:`findings`."""
    items = []
    for line in said:
        if not isinstance(line, Finding):
            items.append(f'<li class="{tone(line)}">{html.escape(line)}</li>')
            continue
        more = html.escape(line.more)
        more = f'<div class="next" style="{UNDER}">next: {more}</div>' if more else ""
        losses = _losses_html(line) if line.losses else ""
        items.append(f'<li class="{tone(line)}">{html.escape(line.lead)}{more}{losses}</li>')
    return "".join(items)


def definition_toggle(definition: str) -> str:
    """A figure's definition behind a toggle (closed): ``<details>`` with its summary line."""
    if not definition:
        return ""
    return (
        f'<details class="definition" style="{DEFINITION}"><summary>What this figure shows'
        f"</summary>{html.escape(definition)}</details>"
    )
