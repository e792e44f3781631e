-- bgq migration 0005_console (PostgreSQL 15): the indexes of the web console (`bgq web`)
--
-- Changes background_job: three indexes.
--   background_job_queue_state (queue, state)   the overview's counts per queue and state, read
--                                            from the index alone (no pass over the rows);
--   background_job_state_updated (state, updated_at)  the overview's last hour: jobs finished and
--                                            failed per minute, one short range per state;
--   background_job_group_id (serial_group, id) WHERE serial_group IS NOT NULL  the jobs page
--                                            filtered to one serial group, a keyset page in id
--                                            order however large or old the group.
-- Why: without them these reads walk the whole table (at 1,000,000 jobs the overview took
--   0.7 s on PostgreSQL and 3.3 s on MariaDB; tools/web_timing.py).
-- Older workers: tolerated. An index changes no row and no result, and older code never names it.
-- Cost: each CREATE INDEX holds a SHARE lock on the table while it builds: inserts and updates
--   wait, reads go on. On a large, busy table, build them beforehand with CREATE INDEX
--   CONCURRENTLY (the same definitions, outside a transaction; check that each ended VALID):
--   this migration then finds them and skips the step. Every insert, state change and heartbeat
--   maintains them afterwards (the partial group index only for grouped jobs).
-- Interrupted: install-procs runs the migration and its record in one transaction, so it is
--   applied with its record or not at all; IF NOT EXISTS also makes it safe to run again.
CREATE INDEX IF NOT EXISTS background_job_queue_state ON background_job (queue, state);

CREATE INDEX IF NOT EXISTS background_job_state_updated ON background_job (state, updated_at);

CREATE INDEX IF NOT EXISTS background_job_group_id
ON background_job (serial_group, id) WHERE serial_group IS NOT NULL;
