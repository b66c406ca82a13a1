-- no-transaction
-- A tenant's workflows, newest first, in the keyset order of GET /v1/workflows: `tenant = $1 AND
-- (created_at, workflow_id) < ($2, $3) ORDER BY created_at DESC, workflow_id DESC` reads the page and nothing
-- else. CONCURRENTLY: built without blocking writes (an old binary still writing meanwhile is fine), and alone in
-- its migration because Postgres runs the statements of one call in one transaction, where CONCURRENTLY cannot
-- run. A build that failed leaves an INVALID index: IF NOT EXISTS would keep it, so drop it and migrate again.
CREATE INDEX CONCURRENTLY workflows_tenant_page ON workflows (tenant, created_at, workflow_id);
