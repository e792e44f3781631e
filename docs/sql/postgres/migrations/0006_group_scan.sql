-- bgq migration 0006_group_scan (PostgreSQL 15): the claimable grouped jobs in (priority, id) order
--
-- Changes background_job: one partial index.
--   background_job_grouped (priority, id) WHERE serial_group IS NOT NULL AND state IN (1, 4, 6, 8)
--                      background_job_claim_batch reads the first few claimable grouped jobs in
--                      (priority, id) order and keeps those that are their group's head, so
--                      an idle group's head is found without one index dive per group.
-- Why: with 100,000 waiting jobs in 5,000 groups the claim took ~50 ms (one dive per group to
--   find every head before ordering them); tools/head_timing.py.
-- Older workers: tolerated. An index changes no row and no result, and older code never names it.
-- Cost: CREATE INDEX holds a SHARE lock on the table while it builds: inserts and updates wait,
--   reads go on. On a large, busy table, build it beforehand with CREATE INDEX CONCURRENTLY (the
--   same definition, outside a transaction; check that it ended VALID): this migration then
--   finds it and skips the step. Every insert and state change of a grouped job maintains it.
-- Interrupted: install-procs runs the migration and its record in one transaction, so it is
--   applied with its record or not at all; IF NOT EXISTS also makes it safe to run again.
CREATE INDEX IF NOT EXISTS background_job_grouped
ON background_job (priority, id) WHERE serial_group IS NOT NULL AND state IN (1, 4, 6, 8);
