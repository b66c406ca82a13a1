-- Heartbeats and releases find a process's leases through the partial workflows_due index (only unfinished
-- workflows hold leases), so this index only cost every payment two more index writes.
DROP INDEX workflows_lease_owner;
