-- bgq migration 0001_bgq_work (PostgreSQL 15): schema version 1 -> 2, what `bgq work` needs
--
-- Changes background_job, in two steps:
--   1. the partial index background_job_ungrouped (priority, id) over the ungrouped claimable jobs
--      (serial_group IS NULL, states 1, 4, 6, 8);
--   2. the trigger function background_job_notify() and the statement-level AFTER INSERT trigger
--      background_job_notify that calls it.
-- Why: `bgq work` (background_job_claim_batch) takes the ungrouped jobs in (priority, id) order; the
--   index holds exactly them, so the claim reads neither grouped nor finished rows. Every INSERT
--   statement into the jobs table sends one NOTIFY on the channel named like the table
--   (delivered at commit), so an idle `bgq work` wakes at once instead of at its next poll (a
--   hint only: workers poll as well).
-- Older workers: tolerated. An index changes no row and no result, and version 1 code never
--   names it; it does not LISTEN, and a NOTIFY nobody listens to costs a little at commit. The
--   trigger takes a brief lock on the table to attach.
-- Cost: CREATE INDEX holds a SHARE lock on the table while it builds: inserts and updates wait,
--   reads go on. On a large, busy table, build it beforehand with
--   CREATE INDEX CONCURRENTLY background_job_ungrouped ON ... (the same definition, outside a
--   transaction; check that it ended VALID): this migration then finds it and skips the step.
-- Interrupted: install-procs runs the migration and its record in one transaction, so it is
--   applied with its record or not at all; IF NOT EXISTS and CREATE OR REPLACE also make it safe
--   to run again. (The function body stays on one line: the installer splits this file at
--   semicolons that end a line.)
CREATE INDEX IF NOT EXISTS background_job_ungrouped
ON background_job (priority, id) WHERE serial_group IS NULL AND state IN (1, 4, 6, 8);

CREATE OR REPLACE FUNCTION background_job_notify() RETURNS TRIGGER LANGUAGE plpgsql AS $$ BEGIN PERFORM PG_NOTIFY('background_job', ''); RETURN NULL; END; $$;  -- noqa: LT05

CREATE OR REPLACE TRIGGER background_job_notify
AFTER INSERT ON background_job
FOR EACH STATEMENT EXECUTE FUNCTION background_job_notify();
