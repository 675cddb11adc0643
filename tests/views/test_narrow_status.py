"""`campaign status NAME` on an 80-column terminal: the stage table leaves out `kind` and each
verdict follows the table on lines of its own (before, the verdict column got two characters
a line); at 120 columns (logs, pipes) the table is as before, verdicts in their column."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from campaign import summary
from campaign.ledger import Ledger, reads
from campaign.views import campaign_table


def _render(led: Ledger, width: int) -> str:
    with led.session() as s:
        c = reads.get_campaign(s, "demo-run")
        assert c is not None
        d = summary.describe_campaign(s, c)
    out = StringIO()
    Console(file=out, width=width, color_system=None).print(campaign_table(d))
    return out.getvalue()


def test_at_80_columns_each_verdict_is_a_readable_line_under_the_table(demo: Ledger) -> None:
    text = _render(demo, 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "kind" not in text.splitlines()[1] + text.splitlines()[2]
    assert "1 smoke: 2/2 ranks reported; all-reduce 3 == 3; 5 steps, loss" in text, text


def test_at_120_columns_the_verdicts_stay_in_their_column(demo: Ledger) -> None:
    text = _render(demo, 120)
    assert "┃ verdict" in text and "kind" in text and "\n1 smoke:" not in text, text
