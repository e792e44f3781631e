-- bgq migration 0003_placeholder: STAND-IN ONLY, on the control-schedules branch.
--
-- Migrations must be numbered without gaps (bgq/migrate.py load()); 0003 belongs to another
-- branch (workers-metrics). This file does nothing and exists only so that 0004_control loads on
-- this branch alone. DELETE IT when merging (the real 0003 takes its place).
CREATE PROCEDURE {{ table }}_migration_0003()
MODIFIES SQL DATA
BEGIN
    DO 0;
END
