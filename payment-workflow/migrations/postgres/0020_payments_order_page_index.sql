-- no-transaction
-- `GET /v1/payments?order_no=` pages an order's payments newest first (issue 35): every attempt refused on a
-- paid order is a record kept for good, so an order may have any number. With the creation time and number in
-- the index, a page is one short range of it read backwards (from the cursor), not a sort of the order's every
-- record. Led by the order number, as 0006 made `payments_order` (which this one replaces, see 0021), so that no
-- cached plan for a tenant's record reads it on the tenant alone. CONCURRENTLY, as 0010: writers are not blocked.
CREATE INDEX CONCURRENTLY IF NOT EXISTS payments_order_page ON payments (order_no, tenant, created_at, request_no);
