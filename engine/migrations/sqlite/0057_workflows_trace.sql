-- The W3C traceparent of the span that started the workflow, when traces are exported: every later run (in
-- whichever process resumes it) joins that trace. Nullable, added in place; NULL when traces are off.
ALTER TABLE workflows ADD COLUMN trace TEXT;
