-- The read models of the main projection (`<home>/projections/ledger.duckdb`).
--
-- Written only by the projector, one transaction per batch of events, together with `tracking`.
-- Every table can be rebuilt from the event log; nothing here is a source of truth.
-- Times are seconds since the Unix epoch (the events' `at`), GPU counts are integers.
-- Column names avoid SQL keywords: `user_name` (not user), `*_at` for times.

-- The schema version this file creates; a projection with another version is rebuilt.
CREATE TABLE meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

-- Where the projection stands in the log: every row of every table below reflects exactly the
-- events at positions <= `position`. Updated in the same transaction as the rows.
CREATE TABLE tracking (
    projection     VARCHAR PRIMARY KEY,
    position       BIGINT NOT NULL,   -- last log position applied
    events         BIGINT NOT NULL,   -- events applied in all
    unknown_events BIGINT NOT NULL    -- events whose tag this code does not know (kept in `events`)
);

-- Every event of the log: common fields as typed columns, the whole event as JSON.
-- `known = false` marks a tag newer than this code: kept for the audit trail, otherwise ignored.
CREATE TABLE events (
    position    BIGINT  NOT NULL,
    tag         VARCHAR NOT NULL,
    known       BOOLEAN NOT NULL,
    occurred_at DOUBLE,             -- the event's `at`
    actor       VARCHAR,
    event_id    VARCHAR,
    job_id      BIGINT,             -- job events
    account     VARCHAR,            -- `path`, `account` or `project` of account/member/job events
    user_name   VARCHAR,            -- `user` of member/admin/manager/job events
    node        VARCHAR,            -- node events
    -- ZSTD: about 1/3 less CPU to write than DuckDB's default string compression, and smaller
    raw         JSON    NOT NULL USING COMPRESSION zstd
);

-- The share history of the budget tree: one row per AccountOpened, SharesSet, AccountClosed.
-- `shares` is set only by SharesSet rows, `open` only by opened/closed rows; the state of an
-- account at time T is the last non-null value of each at or before T (see `accounts_at`).
CREATE TABLE account_history (
    account    VARCHAR NOT NULL,
    position   BIGINT  NOT NULL,
    changed_at DOUBLE  NOT NULL,
    tag        VARCHAR NOT NULL,
    parent     VARCHAR,            -- opened rows only
    kind       VARCHAR,            -- opened rows only: program | project | user
    shares     INTEGER,            -- shares_set rows only
    open       BOOLEAN,            -- opened (true) / closed (false) rows only
    reason     VARCHAR
);

-- Node history: registration rows carry the static fields; every row carries the state after it.
CREATE TABLE node_history (
    node       VARCHAR NOT NULL,
    position   BIGINT  NOT NULL,
    changed_at DOUBLE  NOT NULL,
    tag        VARCHAR NOT NULL,
    cluster    VARCHAR,            -- registered rows only
    gpu_type   VARCHAR,            -- registered rows only
    gpus       INTEGER,            -- registered rows only
    state      VARCHAR NOT NULL,   -- active | draining | drained | removed | lost
    reason     VARCHAR
);

-- Jobs, current state (one row per job; updated in place as its events arrive).
CREATE TABLE jobs (
    job_id             BIGINT  NOT NULL,
    account            VARCHAR NOT NULL,   -- the project it runs in (its team)
    user_name          VARCHAR NOT NULL,
    leaf               VARCHAR NOT NULL,   -- the user leaf charged: <project>/<user>
    gpus               INTEGER NOT NULL,
    gpu_type           VARCHAR,
    cluster            VARCHAR,
    min_runtime_s      BIGINT  NOT NULL,
    funded             BOOLEAN NOT NULL,   -- min_runtime_s > 0
    resumable          BOOLEAN NOT NULL,
    priority           INTEGER NOT NULL,
    debug              BOOLEAN NOT NULL,
    time_limit_s       BIGINT,
    duration_s         DOUBLE,
    submitted_at       DOUBLE  NOT NULL,
    submitted_position BIGINT  NOT NULL,
    status             VARCHAR NOT NULL,   -- pending | placed | running | finished
    placed_at          DOUBLE,             -- the current placement (NULL after a preemption)
    started_at         DOUBLE,
    checkpoint_at      DOUBLE,             -- last checkpoint; a placement counts as one
    finished_at        DOUBLE,
    outcome            VARCHAR,            -- completed | failed | cancelled | preempted
    exit_code          INTEGER,
    placements         INTEGER NOT NULL,
    preemptions        INTEGER NOT NULL,
    last_position      BIGINT  NOT NULL,   -- its last event that changes this row
    held               BOOLEAN NOT NULL,   -- its last hold or release was a hold (JobHeld)
    command            VARCHAR[] NOT NULL, -- as submitted
    logs               VARCHAR[] NOT NULL, -- of its last start ([] before one)
    engine_reason      VARCHAR,            -- how the engine said its last run ended (JobEngineEnded)
    job_name           VARCHAR NOT NULL,   -- `-J` (or its command's name)
    workdir            VARCHAR NOT NULL,   -- the directory it starts in ('' the engine's default)
    array_job_id       BIGINT,             -- a job array's first task id (NULL: no array)
    array_task_id      BIGINT,
    run_started_at     DOUBLE,             -- its last run's start (JobStarted), kept after it ends
    engine_job_id      VARCHAR,            -- the engine's id of its last run (JobEngineLinked)
    finish_reason      VARCHAR,            -- why it ended (JobFinished.reason)
    finish_note        VARCHAR             -- and in words, when there is more to say
);

-- Job intervals: one row per placement, from JobPlaced to the JobPreempted / JobUnplaced /
-- JobFinished that released its GPUs (end_* NULL while it still holds them), with its run's real
-- start (the first JobStarted inside it: its started_at) and, for a run the ledger stopped, its
-- real end (the first JobRunEnded of its run). Usage is computed from these rows: from run_start_at to the
-- earlier of end_at and run_end_at (fairtree-2), or from start_at to end_at (fairtree-1).
CREATE TABLE job_intervals (
    job_id         BIGINT  NOT NULL,
    start_position BIGINT  NOT NULL,       -- the JobPlaced position (the interval's key)
    start_at       DOUBLE  NOT NULL,
    end_position   BIGINT,
    end_at         DOUBLE,
    end_reason     VARCHAR,                -- preempted | unplaced | completed | failed | cancelled
    account        VARCHAR NOT NULL,       -- the project
    user_name      VARCHAR NOT NULL,
    leaf           VARCHAR NOT NULL,       -- <project>/<user>, the account charged
    gpus           INTEGER NOT NULL,
    gpu_type       VARCHAR,                -- the type of the first slot's node
    funded         BOOLEAN NOT NULL,
    cycle_id       VARCHAR,
    slots          STRUCT(node VARCHAR, gpu_indices INTEGER[])[] NOT NULL,
    run_start_position BIGINT,             -- the JobStarted of its run (NULL: not started)
    run_start_at   DOUBLE,                 -- its started_at: the run's real start
    run_end_position BIGINT,               -- the first JobRunEnded of its run (a stopped run)
    run_end_at     DOUBLE                  -- its ended_at: the stopped run's real end
);

-- Preemptions, with the job's team and contract.
CREATE TABLE preemptions (
    position     BIGINT  NOT NULL,
    preempted_at DOUBLE  NOT NULL,
    job_id       BIGINT  NOT NULL,
    reason       VARCHAR NOT NULL,   -- fairness | maintenance | squatting | admin | debug | node_failure
    for_job      BIGINT,
    cycle_id     VARCHAR,
    note         VARCHAR,
    actor        VARCHAR NOT NULL,
    account      VARCHAR,
    user_name    VARCHAR,
    leaf         VARCHAR,
    gpus         INTEGER,
    funded       BOOLEAN,
    resumable    BOOLEAN,            -- true: the job was requeued
    placed_at    DOUBLE              -- start of the interval it ended
);

-- Dispatcher cycles (CycleDecided events).
CREATE TABLE decisions (
    position           BIGINT  NOT NULL,
    decided_at         DOUBLE  NOT NULL,
    cycle_id           VARCHAR NOT NULL,
    based_on           BIGINT  NOT NULL,
    policy_version     VARCHAR NOT NULL,
    placed_jobs        BIGINT[] NOT NULL,
    preempted_jobs     BIGINT[] NOT NULL,
    considered         INTEGER NOT NULL,
    fragmentation_gpus INTEGER NOT NULL,
    policy             JSON                -- the policy's settings (its typed config)
);

-- Accounts as of time t: open or closed, with shares, parent and kind (ASOF-style lookup).
CREATE MACRO accounts_at(t) AS TABLE
    SELECT account AS path,
           arg_max(parent, position) FILTER (WHERE kind IS NOT NULL)   AS parent,
           arg_max(kind, position)   FILTER (WHERE kind IS NOT NULL)   AS kind,
           coalesce(arg_max(shares, position) FILTER (WHERE shares IS NOT NULL), 0) AS shares,
           arg_max(open, position)   FILTER (WHERE open IS NOT NULL)   AS open,
           min(changed_at)                                              AS opened_at,
           max(position)                                                AS last_position
    FROM account_history
    WHERE changed_at <= t
    GROUP BY account;

-- Accounts now.
CREATE VIEW accounts AS SELECT * FROM accounts_at('infinity'::DOUBLE);

-- The share history in one row per change (for `ASOF JOIN account_shares s ON ... AND t >= s.changed_at`).
CREATE VIEW account_shares AS
    SELECT account, changed_at, position, shares, reason
    FROM account_history WHERE shares IS NOT NULL;

-- Nodes as of time t (static fields from the last registration, state after the last event).
CREATE MACRO nodes_at(t) AS TABLE
    SELECT node,
           arg_max(cluster, position)  FILTER (WHERE gpus IS NOT NULL) AS cluster,
           arg_max(gpu_type, position) FILTER (WHERE gpus IS NOT NULL) AS gpu_type,
           arg_max(gpus, position)     FILTER (WHERE gpus IS NOT NULL) AS gpus,
           arg_max(state, position)                                    AS state,
           arg_max(reason, position)                                   AS reason
    FROM node_history
    WHERE changed_at <= t
    GROUP BY node;

-- Nodes now, with the GPUs that open intervals hold.
CREATE VIEW nodes AS
    WITH held AS (
        SELECT s.node AS node, sum(len(s.gpu_indices))::INTEGER AS held_gpus,
               list_sort(flatten(list(s.gpu_indices))) AS held_indices
        FROM (SELECT unnest(slots) AS s FROM job_intervals WHERE end_position IS NULL)
        GROUP BY s.node
    )
    SELECT n.*, coalesce(h.held_gpus, 0) AS held_gpus,
           CASE WHEN n.state = 'removed' THEN 0 ELSE n.gpus - coalesce(h.held_gpus, 0) END AS free_gpus,
           coalesce(h.held_indices, []) AS held_indices
    FROM nodes_at('infinity'::DOUBLE) n LEFT JOIN held h USING (node);

-- Owed and delivered GPU-hours per team (accounts at depth 2, the teams page's) and clock hour,
-- for every hour that has ended in the log: from the first event's hour to the hour of the
-- latest event (`team_hours_span`), as `fairshare.sql`'s `team_runs` gives them: maximal runs,
-- one row per team and stretch of consecutive hours with the same owed and delivered figures
-- (each of its hours has them), only where a team was owed or delivered something (the rest
-- are 0). Kept as events are projected (`projections/kept.py`): a batch reads its new ended
-- hours and joins a team's run ending where it began to its first run when the figures are
-- the same; one that reaches back (a run's real start or end in an hour already kept) reads
-- again from that hour; so the rows are a function of the log, whatever its batches. A
-- whole-period read counts these rows' hours per bucket (no spans joined) and reads only the
-- hours since the latest event. A history spanning centuries with one job running is a few
-- rows, not one per hour.
CREATE TABLE team_hours_kept (
    team            VARCHAR NOT NULL,
    from_at         DOUBLE  NOT NULL,   -- the run's first hour's start
    until_at        DOUBLE  NOT NULL,   -- its last hour's end (> from_at)
    owed_gpu_h      DOUBLE  NOT NULL,   -- in each of its hours
    delivered_gpu_h DOUBLE  NOT NULL
);

-- The span `team_hours_kept` covers: [from_at, until_at), from the first event's hour to the
-- hour the latest event is in (no event after it: the hours since are all alike). No row
-- before the first event with a time.
CREATE TABLE team_hours_span (
    depth    INTEGER PRIMARY KEY,   -- the team depth of the kept hours (2)
    from_at  DOUBLE NOT NULL,
    until_at DOUBLE NOT NULL
);

-- Poison records set aside by a projector in quarantine mode (`gpuledger project follow
-- --quarantine`, see projections/quarantine.py): written in the same transaction as the batch
-- they were met in, each record once. Empty unless quarantine mode met poison.
CREATE TABLE dead_letters (
    topic           VARCHAR,           -- where it sits in Kafka (NULL for other sources)
    kafka_partition INTEGER,
    kafka_offset    BIGINT,
    position        BIGINT,            -- the log position it carried (NULL: none readable)
    tag             VARCHAR,           -- its tag (NULL: none readable)
    reason          VARCHAR NOT NULL,  -- why it cannot be applied
    data            BLOB               -- its bytes as they were (NULL: no value)
);
