"""The read side: DuckDB projections of the event log, window usage, fair share, audit views."""
