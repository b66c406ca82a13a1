-- payments_order led with the tenant. With one tenant (the usual case) and plans made while `payments` was still
-- near empty, a connection's cached generic plan for "the record of (tenant, request_no)" could scan this index
-- on the tenant alone, reading every payment of the tenant: 24 million index tuples over a 30,000-payment
-- benchmark, the largest single cost in its profile. Led by the order number it only serves lookups by order.
DROP INDEX payments_order;
CREATE INDEX payments_order ON payments (order_no, tenant);
