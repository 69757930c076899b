"""Moved to ``ng_otel.gym.collection``; this import path keeps working."""

from ng_otel.gym.collection import ReplaySummary, replay_row, replay_rows, report_row, row_contexts, row_report

__all__ = ["ReplaySummary", "replay_row", "replay_rows", "report_row", "row_contexts", "row_report"]
