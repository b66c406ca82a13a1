-- The unresolved payments (record still 'processing': the charge outcome unknown or the channel said processing),
-- oldest first: what GET /metrics counts and the unresolved-payment warning reads, on every scrape and check.
-- Partial, so it holds only the few payments in flight and the scrape never reads the whole payments table.
CREATE INDEX IF NOT EXISTS payments_unresolved ON payments (created_at) WHERE status = 'processing';
