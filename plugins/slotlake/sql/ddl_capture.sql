-- slotlake DDL capture: event triggers that put table DDL into the logical decoding stream.
--
-- What it does: after every CREATE/ALTER TABLE (and when a table is dropped) it calls
--   pg_logical_emit_message(true, 'slotlake.ddl', <json, UTF-8>)
-- The message is transactional, so it is decoded at the DDL's exact commit, in commit order with the row
-- changes, and disappears with the DDL if that rolls back. pgoutput passes it on with `messages 'true'`
-- (messages are not filtered by publication). slotlake's decode stage parses it with
-- slotlake.source.ddl.parse_ddl_event and feeds the multi-version catalog (`_catalog`).
--
-- Install (needs a SUPERUSER: only superusers may create event triggers; on managed services the
-- equivalent role, e.g. rds_superuser). Event triggers are per database: install in each source database.
--   psql -1 -v ON_ERROR_STOP=1 -d <db> -f sql/ddl_capture.sql        (or slotlake.source.ddl.install_ddl_capture)
-- Re-running it is safe: it replaces the functions and re-creates the triggers. Remove with
-- sql/ddl_capture_uninstall.sql. The file has no BEGIN/COMMIT so a caller can run it inside its own
-- transaction (psql -1 gives the same atomicity).
--
-- JSON format, version 1 (one message per firing; keys may be added within a version, never removed):
--   {"version": 1,
--    "event": "ddl_command_end" | "sql_drop" | "error",
--    "command_tag": "ALTER TABLE",            -- TG_TAG of the top-level command
--    "query": "...", "query_truncated": false, -- current_query(): the client's whole query string, capped
--    "objects": [{"command_tag", "object_type", "schema", "identity", "oid"}],   -- what the command touched
--    "tables":  [<table>],                    -- ddl_command_end: new definition of every touched table,
--                                             -- then of its inheritance children / partitions
--    "dropped": [{"oid", "schema", "name", "identity"}],                         -- sql_drop: dropped tables
--    "error":   {"sqlstate", "message", "detail", "context"} | null}             -- event "error" only
--   <table> = {"oid", "schema", "name", "kind" ('r' table | 'p' partitioned), "replica_identity" (relreplident:
--              d|n|f|i), "columns": [{"attnum", "name", "type_oid", "type_name" (format_type), "typmod",
--              "not_null", "default" (pg_get_expr or null), "generated" ('' | 's'), "identity" ('' | 'a' | 'd'),
--              "is_key"}] in attnum order, dropped columns left out}
-- attnum is stable across RENAME COLUMN and never reused, so a rename (same attnum, new name) can be told
-- apart from DROP + ADD (old attnum gone, new attnum). is_key follows pgoutput's Relation message: primary
-- key columns for d, the REPLICA IDENTITY USING INDEX index's columns for i, every column for f, none for n.
-- slotlake.source.catalog_read builds the same <table> shape for its bootstrap read (a test keeps them equal).
--
-- Failure policy: a bug or an unexpected catalog state in the capture must never block the user's DDL (a
-- raising event trigger aborts every matching command in the database until someone drops it). So each
-- trigger function catches every error (not query cancels) and emits an "error" event instead
-- ({"version", "event": "error", "trigger", "command_tag", "query", "query_truncated", "error"}): the
-- loss is recorded in-stream at the exact commit, the decode stage can report it, and pgoutput's own Relation
-- messages still describe the table before its next row change. If even that emit fails, a WARNING is raised.
--
-- Not captured (limits of event triggers): DDL in other databases, shared objects, single-user mode; column
-- type name changes made through ALTER TYPE/ALTER DOMAIN (the type OID is unchanged; Relation messages carry it);
-- dropping the index a REPLICA IDENTITY USING INDEX points at (the table then behaves as NOTHING).

CREATE SCHEMA IF NOT EXISTS slotlake;
COMMENT ON SCHEMA slotlake IS 'slotlake DDL capture (sql/ddl_capture.sql); remove with sql/ddl_capture_uninstall.sql';
-- The trigger functions run as whoever runs the DDL, so every role needs to reach them. Nothing here is
-- secret or privileged: table_def reads the world-readable catalog, and any role may already call
-- pg_logical_emit_message itself (which also means a slotlake.ddl message is not proof of a DDL).
GRANT USAGE ON SCHEMA slotlake TO PUBLIC;

-- The definition of one table as jsonb (the <table> shape above); null when the OID is not a table.
-- search_path is pinned so format_type and pg_get_expr qualify names the same way whatever the session uses.
CREATE OR REPLACE FUNCTION slotlake.table_def(rel oid) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
  -- table_def select: begin (slotlake.source.catalog_read runs this same text over many tables)
  SELECT jsonb_build_object(
           'oid', c.oid::bigint,
           'schema', n.nspname::text,
           'name', c.relname::text,
           'kind', c.relkind::text,
           'replica_identity', c.relreplident::text,
           'columns', coalesce((
             SELECT jsonb_agg(jsonb_build_object(
                      'attnum', a.attnum::int,
                      'name', a.attname::text,
                      'type_oid', a.atttypid::bigint,
                      'type_name', format_type(a.atttypid, a.atttypmod),
                      'typmod', a.atttypmod,
                      'not_null', a.attnotnull,
                      -- relid 0 unless the expression can name columns (generated columns; a DEFAULT cannot):
                      -- with a relid, pg_get_expr rebuilds the column list per call, O(columns^2) per table
                      'default', pg_get_expr(d.adbin, CASE WHEN a.attgenerated = '' THEN 0 ELSE d.adrelid END),
                      'generated', a.attgenerated::text,
                      'identity', a.attidentity::text,
                      'is_key', CASE c.relreplident
                                  WHEN 'f' THEN true
                                  WHEN 'n' THEN false
                                  ELSE EXISTS (
                                    SELECT 1 FROM pg_index i
                                     WHERE i.indrelid = c.oid
                                       AND CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END
                                       AND a.attnum = ANY (i.indkey::int2[]))
                                END)
                    ORDER BY a.attnum)
               FROM pg_attribute a
               LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '[]'::jsonb))
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
  -- table_def select: end
   WHERE c.oid = rel AND c.relkind IN ('r', 'p')
$fn$;

-- Emit one event. convert_to makes the payload UTF-8 whatever the database encoding.
CREATE OR REPLACE FUNCTION slotlake.emit(event jsonb) RETURNS pg_lsn
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT pg_logical_emit_message(true, 'slotlake.ddl', convert_to(event::text, 'UTF8'))
$fn$;

-- The common head of every event. The query text is capped: a migration sent as one multi-megabyte string
-- would otherwise be copied into the WAL once per DDL statement in it; the definitions are what matters.
CREATE OR REPLACE FUNCTION slotlake.event_head(event text, tag text) RETURNS jsonb
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
  SELECT jsonb_build_object(
           'version', 1,
           'event', event,
           'command_tag', tag,
           'query', left(current_query(), 65536),
           'query_truncated', coalesce(length(current_query()) > 65536, false))
$fn$;

CREATE OR REPLACE FUNCTION slotlake.on_ddl_command_end() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  objects jsonb;
  tables jsonb;
  state text; msg text; detail text; ctx text;
BEGIN
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'command_tag', cmd.command_tag,
           'object_type', cmd.object_type,
           'schema', cmd.schema_name,
           'identity', cmd.object_identity,
           'oid', cmd.objid::bigint)), '[]'::jsonb)
    INTO objects
    FROM pg_event_trigger_ddl_commands() cmd;

  -- Every table a command touched, whatever the object type says ('table', 'table column', ...), and all
  -- their inheritance children and partitions: ALTER TABLE on a parent changes them too (they are what
  -- pgoutput replicates unless publish_via_partition_root), yet PostgreSQL reports only the parent.
  -- Temporary tables are never replicated, so they are left out.
  WITH RECURSIVE touched AS (
    SELECT cmd.objid AS oid, min(cmd.ord) AS first
      FROM pg_event_trigger_ddl_commands() WITH ORDINALITY AS cmd(classid, objid, objsubid, command_tag,
             object_type, schema_name, object_identity, in_extension, command, ord)
     WHERE cmd.classid = 'pg_class'::regclass
     GROUP BY cmd.objid
  ), tree(oid, first, depth) AS (
    SELECT oid, first, 0 FROM touched
    UNION ALL
    SELECT i.inhrelid, tree.first, tree.depth + 1 FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid
  )
  SELECT coalesce(jsonb_agg(slotlake.table_def(t.oid) ORDER BY t.first, t.depth, t.oid), '[]'::jsonb)
    INTO tables
    FROM (SELECT tree.oid, min(tree.first) AS first, min(tree.depth) AS depth FROM tree GROUP BY tree.oid) t
    JOIN pg_class c ON c.oid = t.oid
   WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't';

  IF jsonb_array_length(tables) > 0 THEN
    PERFORM slotlake.emit(slotlake.event_head('ddl_command_end', tg_tag) || jsonb_build_object(
      'objects', objects, 'tables', tables));
  END IF;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                          ctx = PG_EXCEPTION_CONTEXT;
  -- Self-contained on purpose: this path must work even when the other slotlake functions are the problem.
  BEGIN
    PERFORM pg_catalog.pg_logical_emit_message(true, 'slotlake.ddl', pg_catalog.convert_to(
      pg_catalog.jsonb_build_object('version', 1, 'event', 'error', 'trigger', 'ddl_command_end', 'command_tag', tg_tag,
        'query', pg_catalog.left(pg_catalog.current_query(), 65536),
        'query_truncated', coalesce(pg_catalog.length(pg_catalog.current_query()) > 65536, false),
        'error', pg_catalog.jsonb_build_object('sqlstate', state, 'message', msg, 'detail', detail,
                                               'context', ctx))::text, 'UTF8'));
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'slotlake DDL capture failed (% %) and could not record the failure: %', state, msg, SQLERRM
      USING HINT = 'The DDL went ahead; the slotlake catalog may miss it. Reinstall sql/ddl_capture.sql.';
  END;
END
$fn$;

CREATE OR REPLACE FUNCTION slotlake.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  dropped jsonb;
  objects jsonb;
  state text; msg text; detail text; ctx text;
BEGIN
  -- object_type 'table' covers ordinary and partitioned tables (toast tables are 'toast table').
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'oid', d.objid::bigint,
           'schema', d.schema_name,
           'name', d.object_name,
           'identity', d.object_identity)), '[]'::jsonb)
    INTO dropped
    FROM pg_event_trigger_dropped_objects() d
   WHERE d.classid = 'pg_class'::regclass AND d.object_type = 'table' AND d.objsubid = 0 AND NOT d.is_temporary;

  IF jsonb_array_length(dropped) > 0 THEN
    SELECT coalesce(jsonb_agg(jsonb_build_object(
             'command_tag', tg_tag,
             'object_type', d.object_type,
             'schema', d.schema_name,
             'identity', d.object_identity,
             'oid', d.objid::bigint)), '[]'::jsonb)
      INTO objects
      FROM pg_event_trigger_dropped_objects() d
     WHERE d.original;
    PERFORM slotlake.emit(slotlake.event_head('sql_drop', tg_tag) || jsonb_build_object(
      'objects', objects, 'dropped', dropped));
  END IF;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                          ctx = PG_EXCEPTION_CONTEXT;
  -- Self-contained on purpose: this path must work even when the other slotlake functions are the problem.
  BEGIN
    PERFORM pg_catalog.pg_logical_emit_message(true, 'slotlake.ddl', pg_catalog.convert_to(
      pg_catalog.jsonb_build_object('version', 1, 'event', 'error', 'trigger', 'sql_drop', 'command_tag', tg_tag,
        'query', pg_catalog.left(pg_catalog.current_query(), 65536),
        'query_truncated', coalesce(pg_catalog.length(pg_catalog.current_query()) > 65536, false),
        'error', pg_catalog.jsonb_build_object('sqlstate', state, 'message', msg, 'detail', detail,
                                               'context', ctx))::text, 'UTF8'));
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'slotlake DDL capture failed (% %) and could not record the failure: %', state, msg, SQLERRM
      USING HINT = 'The DDL went ahead; the slotlake catalog may miss it. Reinstall sql/ddl_capture.sql.';
  END;
END
$fn$;

-- Only table-shaping commands call the capture at ddl_command_end (CREATE SCHEMA too: it can contain CREATE
-- TABLE). Other DDL never enters slotlake code. sql_drop has no tag filter because tables also disappear
-- through DROP SCHEMA/OWNED/EXTENSION ... CASCADE; the function returns at once when no table was dropped.
DROP EVENT TRIGGER IF EXISTS slotlake_ddl_command_end;
CREATE EVENT TRIGGER slotlake_ddl_command_end ON ddl_command_end
  WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'CREATE SCHEMA')
  EXECUTE FUNCTION slotlake.on_ddl_command_end();

DROP EVENT TRIGGER IF EXISTS slotlake_sql_drop;
CREATE EVENT TRIGGER slotlake_sql_drop ON sql_drop
  EXECUTE FUNCTION slotlake.on_sql_drop();

COMMENT ON EVENT TRIGGER slotlake_ddl_command_end IS 'slotlake: emits slotlake.ddl logical messages (sql/ddl_capture.sql)';
COMMENT ON EVENT TRIGGER slotlake_sql_drop IS 'slotlake: emits slotlake.ddl logical messages (sql/ddl_capture.sql)';
