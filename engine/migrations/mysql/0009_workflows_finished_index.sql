-- The retention pass deletes finished workflows by the time they ended, a batch at a time: one bounded index
-- range per finished state (MySQL has no partial indexes). InnoDB builds it online (ALGORITHM=INPLACE,
-- LOCK=NONE): writers are not blocked while it builds.
ALTER TABLE workflows ADD INDEX workflows_finished (state, updated_at), ALGORITHM = INPLACE, LOCK = NONE;
