-- Whose workflow it is (`Workflow::tenant`), so that a tenant's list filters in the query. Rows already there keep
-- a NULL tenant (see the Postgres migration of the same number): operators list them, their tenant reads each by
-- id, and the history retention deletes them once they are finished.
ALTER TABLE workflows ADD COLUMN tenant TEXT;
