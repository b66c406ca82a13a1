-- A workflow's compensations move into its row, as one JSON array (engine/src/store/compensations.rs): fewer
-- rows per payment, as on Postgres. NULL (none registered yet) reads as an empty list.
ALTER TABLE workflows ADD COLUMN compensations LONGTEXT NULL;
UPDATE workflows w
JOIN (SELECT workflow_id,
             JSON_ARRAYAGG(JSON_OBJECT('seq', seq, 'step_key', step_key, 'name', name, 'input', input,
                                       'status', status)) AS list
      FROM workflow_compensations GROUP BY workflow_id) c ON c.workflow_id = w.workflow_id
SET w.compensations = c.list;
DROP TABLE workflow_compensations;
