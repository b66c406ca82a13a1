-- The order in which a workflow first ran each step (see the Postgres migration of the same number).
ALTER TABLE workflow_steps ADD COLUMN seq INTEGER;
