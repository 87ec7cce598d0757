"""The read side: DuckDB projections of the event log, window usage and hierarchical fair share.

- `source`: the `EventSource` protocol, `LogRecord`, `follow` (the one way to walk a log),
  `ListSource`. The ledger's own store is read by `ledger.store.embedded.EmbeddedSource`.
- `kafka_source`: the relay's Kafka topic as an `EventSource` (`KafkaSource`), `follow`.
- `kafka_wire`: the topic, its record headers, signing and the client settings, as the relay
  writes them and every reader reads them.
- `chain`: the hash chain: `chain_hash`, `prev_hash`, `broken_link`.
- `quarantine`: poison records named where they sit, or set aside in `dead_letters`.
- `batch`: decode (with `schemas.codec`) and validate a batch of records into Arrow tables.
- `store`: the DuckDB file `<home>/projections/ledger.duckdb`, its schema and tracking row.
- `projector`: applies the log in batches, exactly once (`Projector`, `rebuild`).
- `fairshare`: the pure math (window / half-life usage, Fair Tree ranks, owed and delivered).
- `queries`: what the dispatcher and the fair-share reads call (shares table, usage, delivered
  report, ranks).
- `history`: every other read-side query (jobs, the log, decisions, a job's events, the audit's
  tables, what-if's counts), over the projector's tables, events decoded by the codec.
- `testing/`: the Python reference of the read models (`reference`, the tests' oracle), the
  comparison of two projections (`compare`) and synthetic logs (`synthetic`).

The SQL lives in `schema.sql` (tables, views, macros), `apply.sql` (one batch -> read models) and
`fairshare.sql` (usage, level fair share, owed/delivered). Never imports `ledger`: events arrive as
bytes through a source and are decoded with `schemas`. See docs/projections.md.
"""
