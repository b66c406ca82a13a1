-- Of a failed payment: its answer's problem code (order_not_payable, channel_refused, payment_failed, ...), from
-- which that answer is rebuilt byte for byte once its token and stored response are gone (past the response
-- retention), so that a queued command under its number is answered the same before and after. Null for every
-- other payment (no bytes), and for failed ones recorded before. Adding a nullable column rewrites nothing.
ALTER TABLE payments ADD COLUMN IF NOT EXISTS failure_code TEXT;
