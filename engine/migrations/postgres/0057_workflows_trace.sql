-- The W3C traceparent of the span that started the workflow, when traces are exported: every later run (in
-- whichever process resumes it) joins that trace. Nullable without a default: the catalog changes, no row is
-- rewritten; NULL when traces are off.
SET LOCAL lock_timeout = '5s';
ALTER TABLE workflows ADD COLUMN trace TEXT;
