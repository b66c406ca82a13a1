-- GET /v1/workflows pages newest first by (created_at, workflow_id): a tenant's pages, and every tenant's.
CREATE INDEX workflows_tenant_page ON workflows (tenant, created_at, workflow_id);
CREATE INDEX workflows_page ON workflows (created_at, workflow_id);
