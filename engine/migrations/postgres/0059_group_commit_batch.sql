-- The group commit's batch as one call (engine/src/store/postgres/group.rs): many one-statement commits of
-- different workflows run in one transaction, each in a subtransaction of its own, for one round trip and one
-- commit. Each member is a prepared statement of this session named `names[shape[k]]` (prepared from
-- `decls[shape[k]]`, "(types) AS statement", the first time this session runs it), executed with its arguments
-- `args[...]` (its `counts[k]` values, after the members before it), passed as text and quoted here. A member
-- whose statement raises — one of its checks (OF001–OF003), a lock it waited for too long, any error — is rolled
-- back alone and answered its SQLSTATE; the others go on. The statements answer one text[] each; each member's
-- row carries its place in the call (from 1).
--
-- The members' statements are planned with sequential scans turned off: a statement's generic plan, made on its
-- sixth run, lasts as long as the session, and one made while a table was nearly empty (a fresh database: the
-- first batches come within a second of start-up) would scan that table whole as it grows. Every lookup of
-- theirs has an index.
--
-- A member waits at most 20 ms for a row lock (the caller runs it again alone), so that one held up by another
-- transaction holds up none of the batch; the wait is back to the session's by the end, because Postgres takes a
-- lock at commit to queue the members' notifications. Statements prepared under an older `generation` (whose
-- plans the caller wants made again on the tables as they are now) are dropped when a statement of this one is
-- prepared.
CREATE FUNCTION onceflow_batch(generation text, names text[], decls text[], shape int[], counts int[], args text[])
RETURNS TABLE (member int, code text, result text[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    waits text := current_setting('lock_timeout');
    k int;
    j int;
    n int;
    done int := 0;
    call text;
    stale text;
BEGIN
    PERFORM set_config('lock_timeout', '20ms', true);
    PERFORM set_config('enable_seqscan', 'off', true);
    FOR k IN 1 .. coalesce(array_length(shape, 1), 0) LOOP
        call := 'EXECUTE ' || quote_ident(names[shape[k]]) || '(';
        FOR j IN 1 .. counts[k] LOOP
            IF j > 1 THEN
                call := call || ', ';
            END IF;
            call := call || quote_nullable(args[done + j]);
        END LOOP;
        call := call || ')';
        done := done + counts[k];
        member := k;
        code := NULL;
        result := NULL;
        -- Twice at most: the second time after preparing the statement this session did not have.
        FOR n IN 1 .. 2 LOOP
            BEGIN
                EXECUTE call INTO result;
                EXIT;
            EXCEPTION
                WHEN invalid_sql_statement_name THEN
                    IF n = 2 THEN
                        code := SQLSTATE;
                        EXIT;
                    END IF;
                    FOR stale IN
                        SELECT p.name FROM pg_prepared_statements p
                        WHERE p.name LIKE 'onceflow\_b%' AND p.name NOT LIKE 'onceflow\_b' || generation || '\_%'
                    LOOP
                        EXECUTE 'DEALLOCATE ' || quote_ident(stale);
                    END LOOP;
                    EXECUTE 'PREPARE ' || quote_ident(names[shape[k]]) || ' ' || decls[shape[k]];
                WHEN OTHERS THEN
                    code := SQLSTATE;
                    EXIT;
            END;
        END LOOP;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config('lock_timeout', waits, true);
END
$$;
