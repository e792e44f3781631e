-- bgq migration 0004_placeholder: STAND-IN ONLY, on the web-console branch.
--
-- Migrations must be numbered without gaps (bgq/migrate.py load()); 0004 belongs to another
-- branch (control-schedules). This file does nothing and exists only so that 0005_console loads on
-- this branch alone. DELETE IT when merging (the real 0004 takes its place).
CREATE PROCEDURE {{ table }}_migration_0004()
MODIFIES SQL DATA
BEGIN
    DO 0;
END
