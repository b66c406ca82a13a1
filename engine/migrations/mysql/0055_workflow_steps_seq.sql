-- The order in which a workflow first ran each step (see the Postgres migration of the same number). A nullable
-- column is added in place (InnoDB instant ADD COLUMN: no table copy).
ALTER TABLE workflow_steps ADD COLUMN seq INT NULL;
