-- `GET /v1/payments?order_no=` pages an order's payments newest first (issue 35): every attempt refused on a
-- paid order is a record kept for good, so an order may have any number. With the creation time and number in
-- the index, a page is one short range of it, not a sort of the order's every record. It replaces
-- `payments_order (tenant, order_no)`, its prefix, so that a payment's insert maintains one index of the two.
CREATE INDEX IF NOT EXISTS payments_order_page ON payments (tenant, order_no, created_at, request_no);
DROP INDEX IF EXISTS payments_order;
