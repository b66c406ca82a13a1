-- A statement phase on SQLite (a phase of transactional steps sent with its commit as one multi-statement call,
-- `BEGIN IMMEDIATE` to `COMMIT`) aborts itself by inserting a check code here: the triggers roll the whole
-- transaction back and raise the code as the error message, so the engine tells a failed guard (OF001), a lost
-- lease (OF002) and a duplicate start (OF003) apart. No row is ever stored.
CREATE TABLE onceflow_checks (code TEXT NOT NULL);
CREATE TRIGGER onceflow_check_of001 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF001'
BEGIN SELECT RAISE(ROLLBACK, 'OF001'); END;
CREATE TRIGGER onceflow_check_of002 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF002'
BEGIN SELECT RAISE(ROLLBACK, 'OF002'); END;
CREATE TRIGGER onceflow_check_of003 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF003'
BEGIN SELECT RAISE(ROLLBACK, 'OF003'); END;
CREATE TRIGGER onceflow_check_other BEFORE INSERT ON onceflow_checks
WHEN NEW.code NOT IN ('OF001', 'OF002', 'OF003')
BEGIN SELECT RAISE(ROLLBACK, 'onceflow check with an unknown code'); END;
