-- no-transaction
-- An operator's search by a channel's charge id (issue 33, `GET /v1/search`): what a customer's bank statement or
-- the channel's own console names. Without an index it read every payment of every tenant searched. Partial:
-- a payment the channel never charged has none. CONCURRENTLY, as 0010 and 0020: writers are not blocked.
CREATE INDEX CONCURRENTLY IF NOT EXISTS payments_charge ON payments (charge_id) WHERE charge_id IS NOT NULL;
