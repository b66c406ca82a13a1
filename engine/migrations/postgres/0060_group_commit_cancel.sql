-- The group commit's batch (migration 0059), unchanged but for one case: a member's statement cancelled (the
-- role's `statement_timeout`, `pg_cancel_backend`) is raised again from the function instead of from within the
-- member's `EXECUTE`, whose text holds the member's values — idempotency tokens among them — and would be in the
-- error's context, which Postgres logs and sends to the client. The batch is still refused as a whole (nothing of
-- it commits) and each member runs alone, as before. A session ended mid-batch (`pg_terminate_backend`, a
-- shutdown) cannot be caught: its `FATAL` may still carry the text (docs/operations.md).
CREATE OR REPLACE FUNCTION onceflow_batch(generation text, names text[], decls text[], shape int[], counts int[], args text[])
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
                WHEN query_canceled THEN
                    -- Raised again from here, so that the error's context names this line, not the EXECUTE
                    -- with the member's values in it.
                    RAISE EXCEPTION USING ERRCODE = SQLSTATE, MESSAGE = SQLERRM;
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
