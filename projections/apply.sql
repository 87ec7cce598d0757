-- How one batch of events changes the read models. The projector runs these statements in order,
-- inside ONE transaction with the tracking update, after registering the batch as Arrow tables:
--
--   b_events     every record of the batch (typed columns extracted here from `raw`)
--   b_accounts   AccountOpened / SharesSet / AccountClosed as account_history rows
--   b_nodes      node events as node_history rows
--   b_submitted  JobSubmitted as jobs rows (the contract)
--   b_placed     JobPlaced: job_id, position, event_at, cycle_id, slots
--   b_preempted  JobPreempted rows
--   b_finished   JobFinished: position, outcome, exit_code, reason, note, ended_at
--   b_started    JobStarted: position, logs, started_at
--   b_engine_ended JobEngineEnded: position, reason
--   b_engine_linked JobEngineLinked: position, engine_job_id
--   b_run_ended  JobRunEnded: position, job_id, run, ended_at, event_at, started_at, exit_code,
--                by_itself
--   b_cycles     CycleDecided rows
--
-- and, read back from the batch's rows of `events` once they are inserted (temp tables below):
--
--   b_jobev      job lifecycle events: job_id, position, event_at, kind, outcome, exit_code,
--                reason, note, logs, engine_reason, engine_job_id (a finish's event_at is the
--                run's real end when the engine said it: `ended_at`; a start's, its real start:
--                `started_at`)
--
-- Each statement is set-based over the whole batch, so the result does not depend on where batch
-- boundaries fall (a test checks batch size 1 against one big batch). A statement whose input
-- table is empty is skipped (`ends`: the batch's JobPreempted, JobUnplaced and JobFinished, the
-- rows of `b_ends`; `starts`: its JobStarted, the `started` rows of `b_jobev`: counted in
-- Python, so a batch of holds and decisions runs neither interval update: each costs a few
-- milliseconds of planning however empty). Sections start with `-- name:` and list their input in `-- needs:`;
-- `always` sections run for every batch (and once when the projector starts, so that the views
-- over their temp tables can be bound), `setup` sections only when the projector starts.
-- Parameters: $first, $last (the batch's first and last positions), $events, $unknown.

-- name: events
-- needs: b_events
INSERT INTO events
SELECT position, tag, known, f."at", f.actor, f.event_id, f.job_id,
       coalesce(f.path, f.account, f.project), f."user", f.node, raw
FROM (
    SELECT position, tag, known, raw,
           json_transform(raw, '{"at": "DOUBLE", "actor": "VARCHAR", "event_id": "VARCHAR",
               "job_id": "BIGINT", "path": "VARCHAR", "account": "VARCHAR",
               "project": "VARCHAR", "user": "VARCHAR", "node": "VARCHAR"}') AS f
    FROM b_events
);

-- name: account_history
-- needs: b_accounts
INSERT INTO account_history BY NAME SELECT * FROM b_accounts;

-- name: node_history
-- needs: b_nodes
INSERT INTO node_history BY NAME SELECT * FROM b_nodes;

-- name: b_jobev
-- needs: always
-- The batch's job lifecycle events, read back from the rows just inserted into `events` (zone
-- maps on `position` keep the scan to the batch's row groups), with the outcome and exit code of
-- JobFinished from `b_finished`, the logs of JobStarted from `b_started` and the reason of
-- JobEngineEnded from `b_engine_ended` (decoded already: reading them out of `raw` would
-- decompress the whole batch's JSON). A temp table, made once per batch (empty when the batch
-- has none) and read by the statements below.
CREATE OR REPLACE TEMP TABLE b_jobev AS
SELECT job_id, position, coalesce(f.ended_at, s.started_at, occurred_at) AS event_at,
       CASE tag WHEN 'job.placed.v1'         THEN 'placed'
                WHEN 'job.started.v1'        THEN 'started'
                WHEN 'job.preempted.v1'      THEN 'preempted'
                WHEN 'job.requeued.v1'       THEN 'requeued'
                WHEN 'job.unplaced.v1'       THEN 'unplaced'
                WHEN 'job.finished.v1'       THEN 'finished'
                WHEN 'job.finished.v2'       THEN 'finished'
                WHEN 'job.held.v1'           THEN 'held'
                WHEN 'job.released.v1'       THEN 'released'
                WHEN 'job.engine_ended.v1'   THEN 'engine_ended'
                WHEN 'job.engine_ended.v2'   THEN 'engine_ended'
                WHEN 'job.engine_linked.v1'  THEN 'engine_linked'
                ELSE 'checkpointed' END                                       AS kind,
       f.outcome, f.exit_code, f.reason, f.note, s.logs, x.reason AS engine_reason,
       l.engine_job_id, coalesce(s.started_at, occurred_at) AS began_at
FROM events
LEFT JOIN b_finished f USING (position)
LEFT JOIN b_started s USING (position)
LEFT JOIN b_engine_ended x USING (position)
LEFT JOIN b_engine_linked l USING (position)
WHERE position BETWEEN $first AND $last
  AND tag IN ('job.placed.v1', 'job.started.v1', 'job.preempted.v1', 'job.requeued.v1',
              'job.unplaced.v1',
              'job.finished.v1', 'job.finished.v2', 'job.checkpointed.v1', 'job.held.v1',
              'job.released.v1', 'job.engine_ended.v1', 'job.engine_ended.v2',
              'job.engine_linked.v1');

-- name: b_job_changes
-- needs: always
-- Each job's events of the batch folded into the changes they make, mirroring evolve():
--   placed: status placed, placed_at and checkpoint_at = its time  started: running, started_at
--   preempted: placed_at, started_at cleared, preemptions + 1      requeued: pending
--   unplaced: pending, placed_at and started_at cleared (a run taken back unstarted: no
--             preemption; its next placement is a new run, as `placements` counts runs)
--   finished: finished, outcome, exit_code                         checkpointed: checkpoint_at
--   held, released: held (the last one)     started: logs      engine_ended: engine_reason
--   finished: finish_reason, finish_note    engine_linked: engine_job_id
--   placed: run_started_at cleared          started: run_started_at (kept after the run ends)
-- "The last of these events in the batch wins"; `touched_*` tells "no such event" from "cleared".
CREATE OR REPLACE TEMP TABLE b_job_changes AS
SELECT job_id,
    arg_max(CASE kind WHEN 'placed' THEN 'placed' WHEN 'started' THEN 'running'
                      WHEN 'requeued' THEN 'pending' WHEN 'unplaced' THEN 'pending'
                      ELSE 'finished' END, position)
        FILTER (WHERE kind IN ('placed', 'started', 'requeued', 'unplaced', 'finished')) AS status,
    bool_or(kind IN ('placed', 'preempted', 'unplaced'))                       AS touched_placed,
    arg_max_null(CASE WHEN kind = 'placed' THEN event_at END, position)
        FILTER (WHERE kind IN ('placed', 'preempted', 'unplaced'))             AS placed_at,
    bool_or(kind IN ('started', 'preempted', 'unplaced'))                      AS touched_started,
    arg_max_null(CASE WHEN kind = 'started' THEN event_at END, position)
        FILTER (WHERE kind IN ('started', 'preempted', 'unplaced'))            AS started_at,
    arg_max(event_at, position) FILTER (WHERE kind IN ('placed', 'checkpointed')) AS checkpoint_at,
    arg_max(event_at, position) FILTER (WHERE kind = 'finished')               AS finished_at,
    arg_max(outcome, position) FILTER (WHERE kind = 'finished')                AS outcome,
    arg_max_null(exit_code, position) FILTER (WHERE kind = 'finished')         AS exit_code,
    arg_max(kind = 'held', position) FILTER (WHERE kind IN ('held', 'released')) AS held,
    arg_max(logs, position) FILTER (WHERE kind = 'started')                    AS logs,
    arg_max(engine_reason, position) FILTER (WHERE kind = 'engine_ended')      AS engine_reason,
    arg_max(reason, position) FILTER (WHERE kind = 'finished')                 AS finish_reason,
    arg_max(note, position) FILTER (WHERE kind = 'finished')                   AS finish_note,
    arg_max(engine_job_id, position) FILTER (WHERE kind = 'engine_linked')     AS engine_job_id,
    bool_or(kind IN ('placed', 'started'))                                     AS touched_run,
    arg_max_null(CASE WHEN kind = 'started' THEN event_at END, position)
        FILTER (WHERE kind IN ('placed', 'started'))                           AS run_started_at,
    count(*) FILTER (WHERE kind = 'placed')::INTEGER                           AS placements,
    count(*) FILTER (WHERE kind = 'preempted')::INTEGER                        AS preemptions,
    max(position)                                                              AS last_position
FROM b_jobev
GROUP BY job_id;

-- name: b_ends
-- needs: setup
-- The events that release a job's GPUs. (A non-resumable preemption is JobPreempted then
-- JobFinished: the first one ends the interval. A run taken back unstarted, JobUnplaced, ends
-- it `unplaced`: never started, nothing charged.)
CREATE OR REPLACE TEMP VIEW b_ends AS
SELECT job_id, position, event_at,
       CASE WHEN kind IN ('preempted', 'unplaced') THEN kind ELSE outcome END AS end_reason
FROM b_jobev WHERE kind IN ('preempted', 'unplaced', 'finished');

-- name: jobs_submitted
-- needs: b_submitted
-- Jobs submitted in this batch arrive complete: the contract plus the batch's changes.
INSERT INTO jobs BY NAME
SELECT s.*,
       s.account || '/' || s.user_name                        AS leaf,
       s.min_runtime_s > 0                                     AS funded,
       coalesce(c.status, 'pending')                           AS status,
       CASE WHEN c.touched_placed THEN c.placed_at END         AS placed_at,
       CASE WHEN c.touched_started THEN c.started_at END       AS started_at,
       c.checkpoint_at, c.finished_at, c.outcome, c.exit_code,
       coalesce(c.held, false)                                 AS held,
       coalesce(c.logs, []::VARCHAR[])                         AS logs,
       c.engine_reason,
       CASE WHEN c.touched_run THEN c.run_started_at END       AS run_started_at,
       c.engine_job_id, c.finish_reason, c.finish_note,
       coalesce(c.placements, 0)                               AS placements,
       coalesce(c.preemptions, 0)                              AS preemptions,
       greatest(s.submitted_position, coalesce(c.last_position, 0)) AS last_position
FROM b_submitted s LEFT JOIN b_job_changes c USING (job_id);

-- name: jobs_changed
-- needs: b_jobev
-- Jobs submitted in earlier batches are updated in place.
UPDATE jobs SET
    status        = coalesce(u.status, jobs.status),
    placed_at     = CASE WHEN u.touched_placed THEN u.placed_at ELSE jobs.placed_at END,
    started_at    = CASE WHEN u.touched_started THEN u.started_at ELSE jobs.started_at END,
    checkpoint_at = coalesce(u.checkpoint_at, jobs.checkpoint_at),
    finished_at   = coalesce(u.finished_at, jobs.finished_at),
    outcome       = coalesce(u.outcome, jobs.outcome),
    exit_code     = CASE WHEN u.finished_at IS NOT NULL THEN u.exit_code ELSE jobs.exit_code END,
    held          = coalesce(u.held, jobs.held),
    logs          = coalesce(u.logs, jobs.logs),
    engine_reason = coalesce(u.engine_reason, jobs.engine_reason),
    run_started_at = CASE WHEN u.touched_run THEN u.run_started_at ELSE jobs.run_started_at END,
    engine_job_id = coalesce(u.engine_job_id, jobs.engine_job_id),
    finish_reason = coalesce(u.finish_reason, jobs.finish_reason),
    finish_note   = coalesce(u.finish_note, jobs.finish_note),
    placements    = jobs.placements + u.placements,
    preemptions   = jobs.preemptions + u.preemptions,
    last_position = u.last_position
FROM (SELECT * FROM b_job_changes ANTI JOIN b_submitted USING (job_id)) u
WHERE jobs.job_id = u.job_id;

-- name: intervals_opened
-- needs: b_placed
-- A placement opens an interval charged to the job's user leaf; if the job's GPUs are released
-- later in the same batch (the first releasing event after it), the interval arrives closed. Its
-- GPU type is that of the first slot's node as registered before the placement (the last
-- registration at or before it). Both are hash joins on the job or node keeping the nearest
-- match per placement: the same rows as ASOF joins and half the time, as a job has few events
-- and a node few registrations.
INSERT INTO job_intervals BY NAME
SELECT p.job_id, p.position AS start_position, p.event_at AS start_at,
       e.position AS end_position, e.event_at AS end_at, e.end_reason,
       j.account, j.user_name, j.leaf, j.gpus, j.funded, n.gpu_type, p.cycle_id, p.slots,
       r.position AS run_start_position, r.began_at AS run_start_at
FROM b_placed p
JOIN jobs j USING (job_id)
LEFT JOIN (
    SELECT q.position AS start_position, min(x.position) AS position,
           arg_min_null(x.event_at, x.position) AS event_at,
           arg_min_null(x.end_reason, x.position) AS end_reason
    FROM b_placed q
    JOIN b_ends x ON x.job_id = q.job_id AND x.position > q.position
    GROUP BY q.position
) e ON e.start_position = p.position
LEFT JOIN (
    SELECT q.position, arg_max_null(r.gpu_type, r.position) AS gpu_type
    FROM b_placed q
    JOIN node_history r ON r.node = q.slots[1].node AND r.position <= q.position
    WHERE r.gpus IS NOT NULL
    GROUP BY q.position
) n ON n.position = p.position
LEFT JOIN (
    -- its run's start: the first JobStarted after it, before its end (a job starts only placed)
    SELECT q.position AS start_position, min(x.position) AS position,
           arg_min(x.began_at, x.position) AS began_at
    FROM b_placed q
    JOIN b_jobev x ON x.job_id = q.job_id AND x.kind = 'started' AND x.position > q.position
    LEFT JOIN (SELECT job_id, position FROM b_ends) y
        ON y.job_id = q.job_id AND y.position > q.position
    GROUP BY q.position
    HAVING min(x.position) < coalesce(min(y.position), $last + 1)
) r ON r.start_position = p.position;

-- name: intervals_closed
-- needs: ends
-- Intervals opened in earlier batches close at the first releasing event after their start.
UPDATE job_intervals SET
    end_position = c.position,
    end_at       = c.event_at,
    end_reason   = c.end_reason
FROM (
    SELECT i.start_position, e.position, e.event_at, e.end_reason
    FROM (
        SELECT job_id, start_position FROM job_intervals
        WHERE end_position IS NULL AND start_position < (SELECT min(position) FROM b_events)
    ) i
    ASOF JOIN b_ends e ON e.job_id = i.job_id AND e.position > i.start_position
) c
WHERE job_intervals.start_position = c.start_position;

-- name: intervals_started
-- needs: starts
-- Intervals opened in earlier batches and not started yet take the first JobStarted of their job
-- in this batch that comes before their end (intervals_closed ran first: a run's start is inside
-- its interval, and the job's next placement opens a new one).
UPDATE job_intervals SET
    run_start_position = c.position,
    run_start_at       = c.began_at
FROM (
    SELECT i.start_position, min(x.position) AS position, arg_min(x.began_at, x.position) AS began_at
    FROM (
        SELECT job_id, start_position, end_position FROM job_intervals
        WHERE run_start_position IS NULL AND start_position < $first
          AND (end_position IS NULL OR end_position >= $first)
    ) i
    JOIN b_jobev x ON x.job_id = i.job_id AND x.kind = 'started'
        AND (i.end_position IS NULL OR x.position < i.end_position)
    GROUP BY i.start_position
) c
WHERE job_intervals.start_position = c.start_position;

-- name: intervals_run_ended
-- needs: b_run_ended
-- A run's real end as its engine first reports it, on the interval of that run: a JobRunEnded
-- names its run (run r is the job's (r + 1)-th placement: each placement after the first follows
-- a preemption); a JobEngineEnded (run NULL) ends the job's last interval placed before it.
-- A JobRunEnded that says when its run started (`started_at`: a run stopped while placed whose
-- command ran, atk44s F3) starts an interval no JobStarted started, at that time (never before
-- its placement), when recorded within a day of the placement (86400 s:
-- `fairshare.OWN_START_KEPT_S`, which bounds what the in-memory fold keeps).
UPDATE job_intervals SET
    run_end_position = c.position,
    run_end_at       = c.ended_at,
    run_start_position = CASE WHEN job_intervals.run_start_position IS NULL AND c.own_start IS NOT NULL
                              THEN c.position ELSE job_intervals.run_start_position END,
    run_start_at       = CASE WHEN job_intervals.run_start_position IS NULL AND c.own_start IS NOT NULL
                              THEN greatest(job_intervals.start_at, c.own_start)
                              ELSE job_intervals.run_start_at END
FROM (
    SELECT i.start_position, min(r.position) AS position, arg_min(r.ended_at, r.position) AS ended_at,
           arg_min_null(CASE WHEN r.event_at <= i.start_at + 86400.0 THEN r.started_at END,
                        r.position) AS own_start
    FROM b_run_ended r
    JOIN (
        SELECT job_id, start_position, start_at, run_end_position,
               row_number() OVER (PARTITION BY job_id ORDER BY start_position) - 1 AS run,
               lead(start_position) OVER (PARTITION BY job_id ORDER BY start_position) AS next
        FROM job_intervals WHERE job_id IN (SELECT job_id FROM b_run_ended)
    ) i ON i.job_id = r.job_id AND i.run_end_position IS NULL
       AND CASE WHEN r.run IS NULL
                THEN i.start_position < r.position AND coalesce(i.next > r.position, true)
                ELSE i.run = r.run END
    GROUP BY i.start_position
) c
WHERE job_intervals.start_position = c.start_position;

-- name: jobs_run_exit
-- needs: b_run_ended
-- A job its lost node's fence ended (`node_lost`, exit -1: no word from its node) shows its run's
-- real exit code once the returning node reports that run's end (atk46-23 F5), as its end time
-- (`jobs` reads the run's real end). A job cancelled with no exit code (the cancel came before
-- its command's exit was recorded) shows the code its command exited with by itself, before
-- the cancel's SIGTERM reached it (`by_itself`), once its run's end is reported (atk54-23 F4:
-- the command's own code was lost). The report that ended the job's last interval counts (the
-- first, `intervals_run_ended`, above); the outcome and `finish_reason` stay the ledger's: it
-- acted on them (dependents judged, the job not run again).
UPDATE jobs SET exit_code = c.exit_code
FROM (
    SELECT r.job_id, arg_min(r.exit_code, r.position) AS exit_code
    FROM b_run_ended r
    JOIN jobs j ON j.job_id = r.job_id
    JOIN job_intervals i ON i.job_id = r.job_id AND i.run_end_position = r.position
    WHERE r.run IS NOT NULL AND r.exit_code IS NOT NULL AND r.run = j.placements - 1
      AND j.status = 'finished'
      AND (j.engine_reason = 'node_failure'
           OR j.finish_reason = 'cancelled' AND j.exit_code IS NULL AND r.by_itself)
    GROUP BY r.job_id
) c
WHERE jobs.job_id = c.job_id;

-- name: preemptions
-- needs: b_preempted
INSERT INTO preemptions BY NAME
SELECT p.*, j.account, j.user_name, j.leaf, j.gpus, j.funded, j.resumable, i.start_at AS placed_at
FROM b_preempted p
LEFT JOIN jobs j USING (job_id)
LEFT JOIN job_intervals i ON i.job_id = p.job_id AND i.end_position = p.position;

-- name: decisions
-- needs: b_cycles
INSERT INTO decisions BY NAME SELECT * FROM b_cycles;

-- name: tracking
-- needs: b_events
-- $last: the batch's last position; $events, $unknown: its counts.
UPDATE tracking SET
    position       = $last,
    events         = events + $events,
    unknown_events = unknown_events + $unknown
WHERE projection = 'ledger';
