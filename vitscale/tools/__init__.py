"""Tools: FLOP counting (``flops``), MFU, memory estimates, run reports (``report``: report.html)."""

from .flops import count_flops, example_inputs, flops

__all__ = ["count_flops", "example_inputs", "flops"]
