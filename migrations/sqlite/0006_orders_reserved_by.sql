-- The request number of the payment that moved the order to `paying` (and, once confirmed, `paid`). A payment's
-- compensation and its confirm move the order only while it is `paying` under that payment's own number, so a
-- payment never undoes or completes another payment's reservation.
ALTER TABLE orders ADD COLUMN reserved_by TEXT;

-- Orders reserved before this column existed: held by their payment still in flight.
UPDATE orders SET reserved_by = (
    SELECT p.request_no FROM payments p
    WHERE p.tenant = orders.tenant AND p.order_no = orders.order_no AND p.status = 'processing'
    ORDER BY p.created_at DESC LIMIT 1
) WHERE status = 'paying' AND reserved_by IS NULL;
