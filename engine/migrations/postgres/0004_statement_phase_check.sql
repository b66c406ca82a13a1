-- A statement phase (a phase of transactional steps sent with its commit as one statement, no BEGIN/COMMIT)
-- aborts itself through this check: raising rolls back every data-modifying CTE of the statement. `code` is the
-- SQLSTATE raised, so the engine tells a failed guard (OF001), a lost lease (OF002) and a duplicate start (OF003)
-- apart. VOLATILE so that the planner never evaluates it ahead of the condition.
CREATE FUNCTION onceflow_check(ok boolean, code text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'onceflow statement phase aborted (%)', code USING ERRCODE = code;
    END IF;
    RETURN true;
END
$$;
