-- Of a failed payment: its answer's problem code (order_not_payable, channel_refused, payment_failed, ...), from
-- which that answer is rebuilt byte for byte once its token and stored response are gone (past the response
-- retention), so that a queued command under its number is answered the same before and after. Null for every
-- other payment, and for failed ones recorded before.
ALTER TABLE payments ADD COLUMN failure_code TEXT;
