"""What a run warned about is in its summary (vitscale.train.reporting): the warning lines kept in order,
at most MAX_WARNINGS of them and then a count, vitscale's logged warnings among them, and the end-of-run
lines repeating the first few."""

from __future__ import annotations

import logging
from pathlib import Path

from vitscale.train.reporting import MAX_WARNINGS, Warnings
from vitscale.train.summary import SHOWN_WARNINGS, human_summary


def test_warnings_are_kept_in_order_then_counted_and_printed_at_the_end(tmp_path):
    w = Warnings()
    log = logging.getLogger("vitscale.test_reporting")
    logging.getLogger("vitscale").addHandler(w)
    try:
        w.add("warning: step 3: the first")
        log.warning("a bad file: %s", "x.png")  # what vitscale's loggers warn is kept too
        for i in range(MAX_WARNINGS + 7):
            w.add(f"warning: step {10 + i}: more")
    finally:
        logging.getLogger("vitscale").removeHandler(w)
    summary = w.into({"model": "vit_debug", "steps": 3, "wall_time_s": 1.0})
    assert summary["warnings"][:2] == ["warning: step 3: the first", "a bad file: x.png"]
    assert len(summary["warnings"]) == MAX_WARNINGS and summary["warnings_more"] == 9
    text = human_summary(summary, Path(tmp_path), config=tmp_path / "config.yaml", report=False, tensorboard=False,
                         weights=None)  # fmt: skip
    lines = text.splitlines()
    at = lines.index(f"  warnings ({MAX_WARNINGS + 9}, in summary.json):")
    assert lines[at + 1 : at + 1 + SHOWN_WARNINGS] == [f"    {x}" for x in summary["warnings"][:SHOWN_WARNINGS]]
    assert lines[at + 1 + SHOWN_WARNINGS] == f"    ... and {MAX_WARNINGS + 9 - SHOWN_WARNINGS} more"
    assert "warnings" not in Warnings().into({})  # a run that warned about nothing: no key
    assert "warnings (" not in human_summary({"model": "m", "steps": 1}, Path(tmp_path), config="c.yaml", report=False,
                                             tensorboard=False, weights=None)  # fmt: skip
