"""Metrics, reports, traces and plots from a simulated step."""

from mpsim.results.metrics import RankTime, Summary, summarize
from mpsim.results.report import format_summary, summary_dict, summary_json

__all__ = ["RankTime", "Summary", "format_summary", "summarize", "summary_dict", "summary_json"]
