-- An operator's search by a channel's charge id (issue 33, `GET /v1/search`): what a customer's bank statement or
-- the channel's own console names. Without an index it read every payment of every tenant searched. `charge_id`
-- is TEXT, indexed by its first 191 characters (a charge id is far shorter; a longer one is still found, its
-- prefix matched and the rest compared). InnoDB builds it online: writers are not blocked meanwhile.
ALTER TABLE payments ADD INDEX payments_charge (charge_id(191)), ALGORITHM = INPLACE, LOCK = NONE;
