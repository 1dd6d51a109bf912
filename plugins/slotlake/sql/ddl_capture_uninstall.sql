-- Remove slotlake's DDL capture (sql/ddl_capture.sql) from this database. Safe to run when it is not
-- installed. Needs a superuser (or the event triggers' owner).
--   psql -1 -v ON_ERROR_STOP=1 -d <db> -f sql/ddl_capture_uninstall.sql
-- The triggers go first so no DDL in flight can call a function that is being dropped.

DROP EVENT TRIGGER IF EXISTS slotlake_ddl_command_end;
DROP EVENT TRIGGER IF EXISTS slotlake_sql_drop;

DROP FUNCTION IF EXISTS slotlake.on_ddl_command_end();
DROP FUNCTION IF EXISTS slotlake.on_sql_drop();
DROP FUNCTION IF EXISTS slotlake.event_head(text, text);
DROP FUNCTION IF EXISTS slotlake.emit(jsonb);
DROP FUNCTION IF EXISTS slotlake.table_def(oid);

-- The schema goes only if nothing else lives in it (another slotlake part, or a user, may have put objects
-- there); RESTRICT makes PostgreSQL check that for us.
DO $do$
BEGIN
  DROP SCHEMA IF EXISTS slotlake RESTRICT;
EXCEPTION WHEN dependent_objects_still_exist THEN
  RAISE NOTICE 'schema slotlake kept: it still holds objects that are not part of the DDL capture';
END
$do$;
