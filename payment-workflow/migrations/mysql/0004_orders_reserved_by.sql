-- The request number of the payment that moved the order to `paying` (and, once confirmed, `paid`). A payment's
-- compensation and its confirm move the order only while it is `paying` under that payment's own number, so a
-- payment never undoes or completes another payment's reservation.
ALTER TABLE orders ADD COLUMN reserved_by VARCHAR(255) NULL;

-- Orders reserved before this column existed: held by their payment in flight, the oldest processing record of the
-- order with its amount and currency (a payment rejected meanwhile came later; stop the old binaries first).
UPDATE orders o SET reserved_by = (
    SELECT p.request_no FROM payments p
    WHERE p.tenant = o.tenant AND p.order_no = o.order_no AND p.status = 'processing'
      AND p.amount = o.amount AND p.currency = o.currency
    ORDER BY p.created_at, p.request_no LIMIT 1
) WHERE o.status = 'paying' AND o.reserved_by IS NULL;
