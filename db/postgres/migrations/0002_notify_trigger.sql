-- bgq migration 0002_notify_trigger (PostgreSQL 15): schema version 1 -> 2
--
-- Changes {{ table }}: adds the trigger function {{ table }}_notify() and the statement-level
--   AFTER INSERT trigger {{ table }}_notify that calls it.
-- Why: every INSERT statement into the jobs table then sends one NOTIFY on the channel named like
--   the table (delivered at commit), so an idle `bgq work` wakes at once instead of at its next
--   poll. A hint only: workers poll as well.
-- Older workers: tolerated. Version 1 code does not LISTEN; a NOTIFY nobody listens to costs a
--   little at commit and changes no row. The trigger takes a brief lock on the table to attach.
-- Interrupted: install-procs runs the migration and its record in one transaction, so it is
--   applied with its record or not at all; CREATE OR REPLACE also makes it safe to run again.
--   (The function body stays on one line: the installer splits this file at semicolons that end
--   a line.)
CREATE OR REPLACE FUNCTION {{ table }}_notify() RETURNS TRIGGER LANGUAGE plpgsql AS $$ BEGIN PERFORM PG_NOTIFY('{{ table }}', ''); RETURN NULL; END; $$;  -- noqa: LT05

CREATE OR REPLACE TRIGGER {{ table }}_notify
AFTER INSERT ON {{ table }}
FOR EACH STATEMENT EXECUTE FUNCTION {{ table }}_notify();
