-- A statement phase on SQLite (a phase of transactional steps sent with its commit as one multi-statement call
-- inside a savepoint) aborts itself by inserting a check code here: the triggers raise the code as the error
-- message, the engine rolls back to the savepoint, and tells a failed guard (OF001), a lost lease (OF002) and a
-- duplicate start (OF003) apart. No row is ever stored.
CREATE TABLE onceflow_checks (code TEXT NOT NULL);
CREATE TRIGGER onceflow_check_of001 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF001'
BEGIN SELECT RAISE(ABORT, 'OF001'); END;
CREATE TRIGGER onceflow_check_of002 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF002'
BEGIN SELECT RAISE(ABORT, 'OF002'); END;
CREATE TRIGGER onceflow_check_of003 BEFORE INSERT ON onceflow_checks WHEN NEW.code = 'OF003'
BEGIN SELECT RAISE(ABORT, 'OF003'); END;
CREATE TRIGGER onceflow_check_other BEFORE INSERT ON onceflow_checks
WHEN NEW.code NOT IN ('OF001', 'OF002', 'OF003')
BEGIN SELECT RAISE(ABORT, 'onceflow check with an unknown code'); END;
