-- Window usage, fair share and owed/delivered, computed in DuckDB over the read models.
-- The same math as `fairshare.py` (see its docstring for the definitions); `queries.py` runs these.
-- Parameters: $at (seconds since the epoch), $from ($at - window), $half_life_s, the GPU type
-- weights $gt<i> -> $gw<i> (default 1.0), $start, $end, $team_depth (owed/delivered).
-- Sections start with `-- name:`; {interval_usage} and {account_usage} are filled in by
-- `queries.py` with the usage section of the mode asked for.

-- name: window_usage
-- needs: query
-- Funded usage of each interval at $at in the window ($from, $at] ($from = $at - window):
-- GPU-seconds inside it times the GPU type's weight; a running interval counts up to $at.
-- The filter keeps exactly the intervals that overlap the window (their overlap is > 0).
-- {weight} is empty, or `* ` a CASE over the GPU types given weights ($gt0 -> $gw0, ...).
-- (CASE rather than least/greatest and no DECIMAL `* 1.0`: the same values, computed faster.)
-- {start} and {end} are what an interval is charged from and to: `run_start_at` (the run's real
-- start; NULL, never started, is never charged) to a stopped run's real end `run_end_at` when
-- known, else `end_at` (fairtree-3), or to the earlier of the two (fairtree-2); or `start_at`
-- (fairtree-1: the placement) to `end_at`.
SELECT leaf, user_name,
       gpus {weight} * ((CASE WHEN {end} IS NULL OR {end} > $at::DOUBLE THEN $at::DOUBLE
                               ELSE {end} END)
                         - (CASE WHEN {start} > $from::DOUBLE THEN {start}
                                 ELSE $from::DOUBLE END)) AS usage
FROM job_intervals
WHERE funded AND {start} < $at::DOUBLE AND ({end} IS NULL OR {end} > $from::DOUBLE){after}

-- name: half_life_usage
-- needs: query
-- Half-life mode: every GPU-second s counted 2^(-(at - s) / H), integrated in closed form over
-- each funded interval up to $at: gpus * weight * H / ln 2 * (2^(-(at - e) / H) - 2^(-(at - s) / H)).
SELECT leaf, user_name,
       gpus {weight} * $half_life_s::DOUBLE / ln(2)
       * (pow(2.0, -($at::DOUBLE - least(coalesce({end}, $at::DOUBLE), $at::DOUBLE))
                   / $half_life_s::DOUBLE)
          - pow(2.0, -($at::DOUBLE - {start}) / $half_life_s::DOUBLE)) AS usage
FROM job_intervals
WHERE funded AND {start} < $at::DOUBLE{after}

-- name: user_usage
-- needs: query
-- Usage per user name, across the projects they ran in.
SELECT user_name AS name, sum(usage) AS usage
FROM ({interval_usage}) GROUP BY user_name HAVING sum(usage) > 0 ORDER BY user_name

-- name: leaf_usage
-- needs: query
-- Usage per user leaf (the accounts jobs are charged to).
SELECT leaf AS name, sum(usage) AS usage
FROM ({interval_usage}) GROUP BY leaf HAVING sum(usage) > 0

-- name: open_accounts
-- needs: query
-- The open accounts at $at with their shares, by path.
SELECT path, parent, kind, shares FROM accounts_at($at::DOUBLE) WHERE open ORDER BY path

-- name: account_usage
-- needs: query
-- Usage per account: the sum over the user leaves at or below it (every ancestor of a leaf).
WITH leaf AS (
    SELECT leaf, sum(usage) AS usage FROM ({interval_usage}) GROUP BY leaf HAVING sum(usage) > 0
), chain AS (
    SELECT str_split(leaf, '/') AS parts, usage, unnest(range(1, len(str_split(leaf, '/')) + 1)) AS k
    FROM leaf
)
SELECT array_to_string(parts[1:k], '/') AS name, sum(usage) AS usage
FROM chain GROUP BY 1 ORDER BY 1

-- name: fair_share
-- needs: query
-- The open accounts at $at with shares, usage and the level fair share among open siblings:
-- norm shares = shares / siblings' shares, norm usage = usage / siblings' usage,
-- level fs = 0 without shares, inf without usage, else norm shares / norm usage.
WITH usage AS ({account_usage}),
open_accounts AS (
    SELECT a.path, a.parent, a.kind, a.shares, coalesce(u.usage, 0.0) AS usage
    FROM accounts_at($at::DOUBLE) a LEFT JOIN usage u ON u.name = a.path
    WHERE a.open
),
siblings AS (
    SELECT *, sum(shares) OVER (PARTITION BY parent) AS sibling_shares,
              sum(usage) OVER (PARTITION BY parent) AS sibling_usage
    FROM open_accounts
),
normed AS (
    SELECT *, CASE WHEN sibling_shares = 0 THEN 0.0 ELSE shares / sibling_shares END AS norm_shares,
              CASE WHEN sibling_usage = 0 THEN 0.0 ELSE usage / sibling_usage END AS norm_usage
    FROM siblings
)
SELECT path, parent, kind, shares, usage, norm_shares, norm_usage,
       CASE WHEN norm_shares = 0 THEN 0.0
            WHEN norm_usage = 0 THEN 'infinity'::DOUBLE
            ELSE norm_shares / norm_usage END AS level_fs
FROM normed

-- name: team_segments
-- needs: query
-- The body `team_hours` and `team_runs` share: owed and delivered GPU-hours per team (accounts
-- at depth $team_depth) and clock hour of [$start, $end), read at the hours where a figure may
-- change (`points`) only, each row standing for the hours [k, next_k) (k: the hour's number,
-- its start / 3600). delivered = funded interval GPU-hours of the team's leaves; demand = GPUs
-- of its funded jobs while pending or running; capacity = GPUs of nodes while active or
-- draining; allocation = product of the norm shares of the team and its ancestors (open
-- siblings, as of the hour's start); owed = min(allocation * capacity, demand). Spans still
-- going count up to $end ($under: the teams under that account alone, else every one).
-- Between two points nothing changes: every span begins and ends in
-- a point's hour (its partial hour is a point, the one after it too) and every change of the
-- tree is in force from a point; so each hour of a row has the figures of its first, and a
-- history of quiet centuries is a few rows, not one an hour.
WITH bounds AS (
    SELECT floor($start::DOUBLE / 3600)::BIGINT AS k0, ceil($end::DOUBLE / 3600)::BIGINT AS k1
),
teams AS (  -- those under $under alone when given (a team's figures are its own: the rest
            -- only split its hours into more rows)
    SELECT DISTINCT account AS team FROM account_history
    WHERE changed_at < $end::DOUBLE AND len(str_split(account, '/')) = $team_depth
      AND ($under::VARCHAR IS NULL OR starts_with(account || '/', $under::VARCHAR || '/'))
),
-- account state after each distinct change time (last event at that time wins)
changes AS (
    SELECT account, changed_at,
           last_value(shares IGNORE NULLS) OVER w AS shares,
           last_value(open IGNORE NULLS) OVER w AS open,
           row_number() OVER (PARTITION BY account, changed_at ORDER BY position DESC) AS nth
    FROM account_history
    WHERE len(str_split(account, '/')) <= $team_depth
      -- $under: the accounts its teams' allocations are made of alone: those under it and
      -- the children of it and of its ancestors (their siblings split each level); the other
      -- accounts' changes move none of its teams' figures, and at the people's depth they
      -- were most of the moments (a project's review read 70,000 rows for 4 people: 0.5 s)
      AND ($under::VARCHAR IS NULL OR starts_with(account || '/', $under::VARCHAR || '/')
           OR NOT contains(account, '/')
           OR starts_with($under::VARCHAR || '/',
                          array_to_string(str_split(account, '/')[1:-2], '/') || '/'))
    WINDOW w AS (PARTITION BY account ORDER BY position
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
moments AS (  -- when the tree changed: its state is the same from one to the next
    SELECT DISTINCT changed_at AS m FROM changes WHERE nth = 1
),
state AS (
    SELECT t.m, a.account, c.shares, c.open
    FROM moments t
    CROSS JOIN (SELECT DISTINCT account FROM changes) a
    ASOF JOIN (SELECT * FROM changes WHERE nth = 1) c
        ON c.account = a.account AND t.m >= c.changed_at
),
normed AS (
    SELECT m, account,
           coalesce(shares, 0) / nullif(sum(coalesce(shares, 0))
               OVER (PARTITION BY m, array_to_string(str_split(account, '/')[1:-2], '/')), 0)
               AS norm_shares
    FROM state WHERE open
),
allocation_at AS (  -- every team at every moment (levels 0: none of its path is open then)
    SELECT mt.m, mt.team, a.allocation, coalesce(a.levels, 0) AS levels
    FROM (SELECT m, team FROM moments CROSS JOIN teams) mt
    LEFT JOIN (
        SELECT n.m, t.team, product(coalesce(n.norm_shares, 0.0) ORDER BY d.k) AS allocation,
               count(*) AS levels
        FROM teams t
        CROSS JOIN unnest(range(1, $team_depth + 1)) AS d(k)
        JOIN normed n ON n.account = array_to_string(str_split(t.team, '/')[1:k], '/')
        GROUP BY n.m, t.team
    ) a ON a.m = mt.m AND a.team = mt.team
),
spans AS (  -- (kind, key, gpus, lo, hi) clipped to [start, end); only the ones inside it
            -- (hi > lo): the rest are left out as they are read, not after
    SELECT 'delivered' AS kind, leaf AS key, gpus,
           greatest(start_at, $start::DOUBLE) AS lo,
           least(coalesce(end_at, $end::DOUBLE), $end::DOUBLE) AS hi
    FROM job_intervals
    WHERE funded AND start_at < $end::DOUBLE AND (end_at IS NULL OR end_at > $start::DOUBLE)
      -- (those under $under alone, as `keyed` keeps them: left out as they are read)
      AND ($under::VARCHAR IS NULL OR starts_with(leaf || '/', $under::VARCHAR || '/'))
    UNION ALL
    SELECT 'demand', leaf, gpus, greatest(submitted_at, $start::DOUBLE),
           least(coalesce(finished_at, $end::DOUBLE), $end::DOUBLE)
    FROM jobs
    WHERE funded AND submitted_at < $end::DOUBLE
      AND (finished_at IS NULL OR finished_at > $start::DOUBLE)
      AND ($under::VARCHAR IS NULL OR starts_with(leaf || '/', $under::VARCHAR || '/'))
    UNION ALL
    SELECT 'capacity', node, gpus, greatest(changed_at, $start::DOUBLE),
           least(coalesce(next_at, $end::DOUBLE), $end::DOUBLE)
    FROM (
        SELECT node, changed_at, state,
               last_value(gpus IGNORE NULLS) OVER (PARTITION BY node ORDER BY position
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS gpus,
               lead(changed_at) OVER (PARTITION BY node ORDER BY position) AS next_at
        FROM node_history
    ) WHERE state IN ('active', 'draining')
),
pieces AS (  -- a span's first and last hours, and the hours between them (b > a + 1)
    SELECT kind, key, gpus, lo, hi,
           floor(lo / 3600)::BIGINT AS a, floor(hi / 3600)::BIGINT AS b
    FROM spans WHERE hi > lo
),
edges AS (  -- a span is two partial hours and a rate of `gpus` GPU-hours an hour between them
            -- (+gpus from a + 1, -gpus from b): its cost does not grow with its length (a node
            -- active for a year is 4 rows, not 8,760)
    SELECT kind, key, a AS k, gpus * (least(hi, a * 3600.0 + 3600.0) - lo) / 3600.0 AS part,
           0 AS rate
    FROM pieces
    UNION ALL
    SELECT kind, key, b, gpus * (hi - b * 3600.0) / 3600.0, 0 FROM pieces WHERE b > a
    UNION ALL
    SELECT kind, key, a + 1, 0.0, gpus FROM pieces WHERE b > a + 1
    UNION ALL
    SELECT kind, key, b, 0.0, -gpus FROM pieces WHERE b > a + 1
),
keyed AS (  -- by the team the key is under ('' for the capacity's nodes); the parts summed
            -- exactly (each rounded once to 1e-18 GPU-hours): an hour's figure is the same
            -- whatever window it is read in and in whatever order the engine's threads add
            -- them, so the projection's kept hours are the same byte for byte however the log
            -- was batched (`team_hours_kept`)
    SELECT kind,
           CASE WHEN kind = 'capacity' THEN ''
                ELSE array_to_string(str_split(key, '/')[1:$team_depth], '/') END AS team,
           k, sum(part::DECIMAL(38, 18)) AS part, sum(rate)::BIGINT AS rate
    FROM edges
    WHERE kind = 'capacity' OR len(str_split(key, '/')) >= $team_depth
        AND ($under::VARCHAR IS NULL OR starts_with(key || '/', $under::VARCHAR || '/'))
    GROUP BY ALL
),
running AS (  -- the rate summed up to each hour a span begins or ends in (a few rows)
    SELECT kind, team, k, part,
           sum(rate) OVER (PARTITION BY kind, team ORDER BY k
                           ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS rate_sum
    FROM keyed
),
points AS (  -- the hours where a figure may change, each with the next one (k1: none): the
             -- window's first; every hour a span begins or ends in and the hour after it; and
             -- the first hour a change of the tree is in force at (its hour's start at or
             -- after the change: floor(m / 3600) and the next, whatever the division rounds)
    SELECT k, k * 3600.0 AS h,
           coalesce(lead(k) OVER (ORDER BY k), (SELECT k1 FROM bounds)) AS next_k
    FROM (
        SELECT DISTINCT k FROM (
            SELECT k0 AS k FROM bounds
            UNION ALL SELECT k FROM keyed
            UNION ALL SELECT k + 1 FROM keyed
            UNION ALL SELECT floor(m / 3600)::BIGINT FROM moments
            UNION ALL SELECT floor(m / 3600)::BIGINT + 1 FROM moments
        )
        WHERE k >= (SELECT k0 FROM bounds) AND k < (SELECT k1 FROM bounds)
    )
),
allocation AS (  -- per point, as of its hour's start: the tree's last change at or before it
                 -- (computed once per change, not once per hour: a year is 8,760 hours)
    SELECT g.h, t.team, a.allocation, a.levels
    FROM points g
    CROSS JOIN teams t
    ASOF JOIN allocation_at a ON a.team = t.team AND g.h >= a.m
),
spread AS (  -- per point: its partial hours plus the rate summed up to it (the last hour a
             -- span begins or ends in at or before it)
    SELECT o.kind, o.team, g.h,
           (CASE WHEN r.k = g.k THEN r.part ELSE 0 END
            + coalesce(r.rate_sum, 0)::DECIMAL(38, 18))::DOUBLE
               AS gpu_h
    FROM (SELECT DISTINCT kind, team FROM keyed) o
    CROSS JOIN points g
    ASOF LEFT JOIN running r ON r.kind = o.kind AND r.team = o.team AND g.k >= r.k
),
capacity AS (
    SELECT h, gpu_h AS capacity_gpu_h FROM spread WHERE kind = 'capacity'
),
team_spread AS (
    SELECT kind, team, h, gpu_h FROM spread WHERE kind <> 'capacity'
)
SELECT t.team, g.k, g.next_k,
       coalesce(c.capacity_gpu_h, 0.0) AS capacity_gpu_h,
       CASE WHEN a.levels = $team_depth THEN coalesce(a.allocation, 0.0) ELSE 0.0 END AS allocation,
       coalesce(dm.gpu_h, 0.0) AS demand_gpu_h,
       least(CASE WHEN a.levels = $team_depth THEN coalesce(a.allocation, 0.0) ELSE 0.0 END
             * coalesce(c.capacity_gpu_h, 0.0), coalesce(dm.gpu_h, 0.0)) AS owed_gpu_h,
       coalesce(dl.gpu_h, 0.0) AS delivered_gpu_h
FROM teams t
CROSS JOIN points g
LEFT JOIN capacity c ON c.h = g.h
LEFT JOIN allocation a ON a.team = t.team AND a.h = g.h
LEFT JOIN team_spread dm ON dm.kind = 'demand' AND dm.team = t.team AND dm.h = g.h
LEFT JOIN team_spread dl ON dl.kind = 'delivered' AND dl.team = t.team AND dl.h = g.h

-- name: team_hours
-- needs: query
-- Owed and delivered GPU-hours per team and clock hour of [$start, $end) (`team_segments`,
-- each of its rows one row an hour), by team and hour.
SELECT team, hk * 3600.0 AS hour, capacity_gpu_h, allocation, demand_gpu_h, owed_gpu_h,
       delivered_gpu_h
FROM (SELECT *, unnest(range(k, next_k)) AS hk FROM ({team_segments}))
ORDER BY team, hour

-- name: team_runs
-- needs: query
-- The hours of `team_segments` as maximal runs: per team, each stretch of consecutive hours
-- with the same owed and delivered GPU-hours is one row [from_at, until_at) with those figures
-- (its first hour's), by team and start. What the projection keeps (`team_hours_kept`).
WITH segments AS ({team_segments}),
marked AS (
    SELECT team, k, next_k, owed_gpu_h, delivered_gpu_h,
           CASE WHEN lag(owed_gpu_h) OVER w = owed_gpu_h
                 AND lag(delivered_gpu_h) OVER w = delivered_gpu_h THEN 0 ELSE 1 END AS new_run
    FROM segments
    WINDOW w AS (PARTITION BY team ORDER BY k)
),
numbered AS (
    SELECT *, sum(new_run) OVER (PARTITION BY team ORDER BY k
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run
    FROM marked
)
SELECT team, min(k) * 3600.0 AS from_at, max(next_k) * 3600.0 AS until_at,
       arg_min(owed_gpu_h, k) AS owed_gpu_h, arg_min(delivered_gpu_h, k) AS delivered_gpu_h
FROM numbered
GROUP BY team, run
ORDER BY team, from_at
