-- GET /v1/workflows pages newest first by (created_at, workflow_id): a tenant's pages, and every tenant's.
-- Online DDL: InnoDB builds a secondary index without blocking writes.
ALTER TABLE workflows ADD INDEX workflows_tenant_page (tenant, created_at, workflow_id), ALGORITHM = INPLACE, LOCK = NONE;
ALTER TABLE workflows ADD INDEX workflows_page (created_at, workflow_id), ALGORITHM = INPLACE, LOCK = NONE;
