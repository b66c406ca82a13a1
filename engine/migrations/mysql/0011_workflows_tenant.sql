-- Whose workflow it is (`Workflow::tenant`), so that a tenant's list filters in the query. A nullable column is
-- added in place (InnoDB instant ADD COLUMN on MySQL 8.0.12+ / MariaDB 10.3+: no table copy). Rows already there
-- keep a NULL tenant (see the Postgres migration of the same number).
ALTER TABLE workflows ADD COLUMN tenant VARCHAR(255) NULL;
