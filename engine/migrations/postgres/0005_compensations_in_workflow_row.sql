-- A workflow's compensations move into its row, as one JSON array (engine/src/store/compensations.rs): a
-- payment registers four, which as rows of their own cost four heap and four index inserts per payment.
ALTER TABLE workflows ADD COLUMN compensations TEXT NOT NULL DEFAULT '[]';
UPDATE workflows w SET compensations = c.list
FROM (SELECT workflow_id,
             json_agg(json_build_object('seq', seq, 'step_key', step_key, 'name', name, 'input', input,
                                        'status', status) ORDER BY seq)::text AS list
      FROM workflow_compensations GROUP BY workflow_id) c
WHERE w.workflow_id = c.workflow_id;
DROP TABLE workflow_compensations;
