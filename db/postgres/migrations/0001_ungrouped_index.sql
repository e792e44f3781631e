-- bgq migration 0001_ungrouped_index (PostgreSQL 15): schema version 1 -> 2
--
-- Changes {{ table }}: adds the partial index {{ table }}_ungrouped (priority, id) over the
--   ungrouped claimable jobs (serial_group IS NULL, states 1, 4, 6, 8).
-- Why: `bgq work` ({{ table }}_claim_batch) takes those jobs in (priority, id) order; the index
--   holds exactly them, so the claim reads neither grouped nor finished rows.
-- Older workers: tolerated. An index changes no row and no result; version 1 code never names it.
-- Cost: CREATE INDEX holds a SHARE lock on the table while it builds: inserts and updates wait,
--   reads go on. On a large, busy table, build it beforehand with
--   CREATE INDEX CONCURRENTLY {{ table }}_ungrouped ON ... (the same definition, outside a
--   transaction; check that it ended VALID): this migration then finds it and skips the step.
-- Interrupted: install-procs runs the migration and its record in one transaction, so it is
--   applied with its record or not at all; IF NOT EXISTS also makes it safe to run again.
CREATE INDEX IF NOT EXISTS {{ table }}_ungrouped
ON {{ table }} (priority, id) WHERE serial_group IS NULL AND state IN (1, 4, 6, 8);
