-- no-transaction
-- `payments_order (order_no, tenant)` is a prefix of `payments_order_page` (0020), which serves every query it
-- served: dropped, so that a payment's insert maintains one index of the two. CONCURRENTLY: a plain DROP INDEX
-- would wait for, and then block, every payment writing the table.
DROP INDEX CONCURRENTLY IF EXISTS payments_order;
