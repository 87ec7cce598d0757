"""The read side: DuckDB projections of the event log, window usage and hierarchical fair share.

- `source`: the `EventSource` protocol, `LogRecord`, the embedded SQLite log (`EmbeddedSource`).
- `kafka_source`: the relay's Kafka topic as an `EventSource` (`KafkaSource`), `follow`.
- `chain`: what a reader checks before applying a record: the hash chain, optional signatures.
- `quarantine`: poison records named where they sit, or set aside in `dead_letters`.
- `batch`: decode and validate a batch of records into Arrow tables (pure).
- `store`: the DuckDB file `<home>/projections/ledger.duckdb`, its schema and tracking row.
- `projector`: applies the log in batches, exactly once (`project`, `rebuild`, `Projector`).
- `fairshare`: the pure math (window / half-life usage, Fair Tree ranks, owed and delivered).
- `queries`: what the CLI and the dispatcher call (shares table, usage, delivered report, ranks).
- `reference`: the same read models and numbers folded in plain Python (the tests' oracle).
- `audit`: compare a projection with a clean rebuild or with the reference, table by table.
- `synthetic`: simulated event logs written straight into the SQLite store (tests, benchmarks).

The SQL lives in `schema.sql` (tables, views, macros), `apply.sql` (one batch -> read models) and
`fairshare.sql` (usage, level fair share, owed/delivered). Never imports `ledger`: events arrive as
bytes through a source and are decoded with `schemas`. See docs/projections.md.
"""
