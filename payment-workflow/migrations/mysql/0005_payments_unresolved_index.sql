-- The unresolved payments (record still 'processing': the charge outcome unknown or the channel said processing),
-- oldest first: what GET /metrics counts and the unresolved-payment warning reads, on every scrape and check.
-- MySQL has no partial index: led by the status, the scrape reads only the 'processing' range of it.
CREATE INDEX payments_unresolved ON payments (status, created_at);
