-- A workflow's compensations move into its row, as one JSON array (engine/src/store/compensations.rs): fewer
-- rows per payment, as on Postgres.
ALTER TABLE workflows ADD COLUMN compensations TEXT NOT NULL DEFAULT '[]';
UPDATE workflows SET compensations = (
    SELECT json_group_array(json_object('seq', seq, 'step_key', step_key, 'name', name, 'input', input,
                                        'status', status))
    FROM (SELECT * FROM workflow_compensations c WHERE c.workflow_id = workflows.workflow_id ORDER BY seq))
WHERE workflow_id IN (SELECT workflow_id FROM workflow_compensations);
DROP TABLE workflow_compensations;
