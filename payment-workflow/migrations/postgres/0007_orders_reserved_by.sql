-- The request number of the payment that moved the order to `paying` (and, once confirmed, `paid`). A payment's
-- compensation and its confirm move the order only while it is `paying` under that payment's own number, so a
-- payment never undoes or completes another payment's reservation. Adding a nullable column rewrites nothing.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS reserved_by TEXT;

-- Orders reserved before this column existed: held by their payment in flight, the oldest processing record of the
-- order with its amount and currency (a payment rejected meanwhile came later; stop the old binaries first).
UPDATE orders SET reserved_by = (
    SELECT p.request_no FROM payments p
    WHERE p.tenant = orders.tenant AND p.order_no = orders.order_no AND p.status = 'processing'
      AND p.amount = orders.amount AND p.currency = orders.currency
    ORDER BY p.created_at, p.request_no LIMIT 1
) WHERE status = 'paying' AND reserved_by IS NULL;
