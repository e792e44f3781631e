-- bgq migration 0002_placeholder: STAND-IN ONLY, on the control-schedules branch.
--
-- Migrations must be numbered without gaps (bgq/migrate.py load()); 0002 belongs to another
-- branch (finish-path). This file does nothing and exists only so that 0004_control loads on
-- this branch alone. DELETE IT when merging (the real 0002 takes its place).
SELECT 1;
