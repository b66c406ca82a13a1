//! [`ChannelWordStore`] on every backend: the queries are the same SQL, built with `QueryBuilder` (which writes
//! each backend's placeholders); what differs is in the backend's own file, named by `$dialect`.

use onceflow_engine::Store;
use sqlx::QueryBuilder;

use super::{ChannelWord, ChannelWordStore, ExceptionRow, ReconciliationRow, StagedLine, StatementCopy};
use crate::model::PaymentRecord;
use crate::store::PassLock;

macro_rules! channel_word_store {
    ($store:ty, $db:ty, $dialect:ident) => {
        impl ChannelWordStore for $store {
            async fn record_word(&self, w: &ChannelWord) -> Result<bool, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(super::$dialect::INSERT_IGNORE);
                q.push(
                    " channel_notifications (merchant_id, notification_id, source, tenant, kind, number, status, \
                     amount, body, received_at, applied_at, outcome) VALUES (",
                );
                let mut v = q.separated(", ");
                v.push_bind(w.merchant_id.clone())
                    .push_bind(w.notification_id.clone())
                    .push_bind(w.source.clone())
                    .push_bind(w.tenant.clone())
                    .push_bind(w.kind.clone())
                    .push_bind(w.number.clone())
                    .push_bind(w.status.clone())
                    .push_bind(w.amount)
                    .push_bind(w.body.clone())
                    .push_bind(w.received_at)
                    .push_bind(w.applied_at)
                    .push_bind(w.outcome.clone());
                q.push(")").push(super::$dialect::IGNORE_SUFFIX);
                let done = q.build().execute(self.write_pool()).await?;
                Ok(done.rows_affected() == 1)
            }

            async fn words_on(&self, tenant: &str, kind: &str, number: &str) -> Result<Vec<ChannelWord>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new("SELECT * FROM channel_notifications WHERE tenant = ");
                q.push_bind(tenant.to_owned()).push(" AND kind = ").push_bind(kind.to_owned());
                q.push(" AND number = ").push_bind(number.to_owned()).push(" ORDER BY received_at, notification_id");
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn mark_word(
                &self,
                merchant_id: &str,
                notification_id: &str,
                outcome: &str,
                now: i64,
            ) -> Result<bool, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new("UPDATE channel_notifications SET applied_at = ");
                q.push_bind(now).push(", outcome = ").push_bind(outcome.to_owned());
                q.push(" WHERE merchant_id = ").push_bind(merchant_id.to_owned());
                q.push(" AND notification_id = ").push_bind(notification_id.to_owned()).push(" AND applied_at IS NULL");
                Ok(q.build().execute(self.write_pool()).await?.rows_affected() == 1)
            }

            async fn unapplied_words(&self, limit: i64) -> Result<Vec<ChannelWord>, sqlx::Error> {
                // Through the index of what is still to deliver (partial on Postgres and SQLite).
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT * FROM channel_notifications WHERE applied_at IS NULL ORDER BY received_at LIMIT ",
                );
                q.push_bind(limit);
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn count_words(&self) -> Result<i64, sqlx::Error> {
                QueryBuilder::<$db>::new("SELECT COUNT(*) FROM channel_notifications")
                    .build_query_scalar()
                    .fetch_one(self.pool())
                    .await
            }

            async fn lock_reconcile(&self) -> Result<Option<PassLock>, sqlx::Error> {
                super::$dialect::lock(self).await
            }

            async fn begin_scratch(&self, id: &str, tenant: &str, day: &str, now: i64) -> Result<(), sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "INSERT INTO reconciliation_scratch (id, tenant, day, started_at) VALUES (",
                );
                q.separated(", ")
                    .push_bind(id.to_owned())
                    .push_bind(tenant.to_owned())
                    .push_bind(day.to_owned())
                    .push_bind(now);
                q.push(")").build().execute(self.write_pool()).await?;
                Ok(())
            }

            async fn stage_lines(&self, copy_id: &str, lines: &[StagedLine]) -> Result<(), sqlx::Error> {
                if lines.is_empty() {
                    return Ok(());
                }
                let mut q = QueryBuilder::<$db>::new(super::$dialect::INSERT_IGNORE);
                q.push(" statement_lines (copy_id, kind, number, status, amount, line) ");
                q.push_values(lines, |mut v, l| {
                    v.push_bind(copy_id.to_owned())
                        .push_bind(l.kind.clone())
                        .push_bind(l.number.clone())
                        .push_bind(l.status.clone())
                        .push_bind(l.amount)
                        .push_bind(l.line.clone());
                });
                q.push(super::$dialect::IGNORE_SUFFIX);
                q.build().execute(self.write_pool()).await?;
                Ok(())
            }

            async fn analyze_lines(&self) -> Result<(), sqlx::Error> {
                if let Some(sql) = super::$dialect::ANALYZE_LINES {
                    QueryBuilder::<$db>::new(sql).build().execute(self.pool()).await?;
                }
                Ok(())
            }

            async fn set_copy(&self, c: &StatementCopy) -> Result<(), sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "INSERT INTO statement_copies (tenant, day, copy_id, complete, line_count, fetched_at) VALUES (",
                );
                q.separated(", ")
                    .push_bind(c.tenant.clone())
                    .push_bind(c.day.clone())
                    .push_bind(c.copy_id.clone())
                    .push_bind(c.complete)
                    .push_bind(c.line_count)
                    .push_bind(c.fetched_at);
                q.push(")").push(super::$dialect::UPSERT_COPY);
                q.build().execute(self.write_pool()).await?;
                Ok(())
            }

            async fn copy_of(&self, tenant: &str, day: &str) -> Result<Option<StatementCopy>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new("SELECT * FROM statement_copies WHERE tenant = ");
                q.push_bind(tenant.to_owned()).push(" AND day = ").push_bind(day.to_owned());
                q.build_query_as().fetch_optional(self.pool()).await
            }

            async fn lines_after(
                &self,
                copy_id: &str,
                kind: &str,
                number: &str,
                limit: i64,
            ) -> Result<Vec<StagedLine>, sqlx::Error> {
                // Keyset over the primary key (copy_id, kind, number): each batch one range of it.
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT kind, number, status, amount, line FROM statement_lines WHERE copy_id = ",
                );
                q.push_bind(copy_id.to_owned()).push(" AND kind = ").push_bind(kind.to_owned());
                q.push(" AND number > ").push_bind(number.to_owned());
                q.push(" ORDER BY number LIMIT ").push_bind(limit);
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn lines_numbered(
                &self,
                copy_id: &str,
                kind: &str,
                numbers: &[String],
            ) -> Result<Vec<StagedLine>, sqlx::Error> {
                if numbers.is_empty() {
                    return Ok(Vec::new());
                }
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT kind, number, status, amount, line FROM statement_lines WHERE copy_id = ",
                );
                q.push_bind(copy_id.to_owned()).push(" AND kind = ").push_bind(kind.to_owned());
                q.push(" AND number IN (");
                let mut list = q.separated(", ");
                for n in numbers {
                    list.push_bind(n.clone());
                }
                q.push(")");
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn payments_numbered(
                &self,
                tenant: &str,
                numbers: &[String],
            ) -> Result<Vec<PaymentRecord>, sqlx::Error> {
                if numbers.is_empty() {
                    return Ok(Vec::new());
                }
                let mut q = QueryBuilder::<$db>::new("SELECT * FROM payments WHERE tenant = ");
                q.push_bind(tenant.to_owned()).push(" AND request_no IN (");
                let mut list = q.separated(", ");
                for n in numbers {
                    list.push_bind(n.clone());
                }
                q.push(")");
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn succeeded_between(
                &self,
                tenant: &str,
                from: i64,
                to: i64,
                after: &str,
                limit: i64,
            ) -> Result<Vec<PaymentRecord>, sqlx::Error> {
                // Through the primary key (tenant, request_no), read in order: once a day, per tenant.
                let mut q = QueryBuilder::<$db>::new("SELECT * FROM payments WHERE tenant = ");
                q.push_bind(tenant.to_owned()).push(" AND request_no > ").push_bind(after.to_owned());
                q.push(" AND status = 'succeeded' AND updated_at >= ").push_bind(from);
                q.push(" AND updated_at < ").push_bind(to).push(" ORDER BY request_no LIMIT ").push_bind(limit);
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn insert_exceptions(&self, run_id: &str, rows: &[ExceptionRow]) -> Result<(), sqlx::Error> {
                if rows.is_empty() {
                    return Ok(());
                }
                let mut q = QueryBuilder::<$db>::new(super::$dialect::INSERT_IGNORE);
                q.push(" reconciliation_exceptions (run_id, kind, number, class, ours, channel, action) ");
                q.push_values(rows, |mut v, r| {
                    v.push_bind(run_id.to_owned())
                        .push_bind(r.kind.clone())
                        .push_bind(r.number.clone())
                        .push_bind(r.class.clone())
                        .push_bind(r.ours.clone())
                        .push_bind(r.channel.clone())
                        .push_bind(r.action.clone());
                });
                q.push(super::$dialect::IGNORE_SUFFIX);
                q.build().execute(self.write_pool()).await?;
                Ok(())
            }

            async fn set_reconciliation(&self, r: &ReconciliationRow) -> Result<(), sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "INSERT INTO reconciliations (tenant, day, run_id, state, ran_at, counts) VALUES (",
                );
                q.separated(", ")
                    .push_bind(r.tenant.clone())
                    .push_bind(r.day.clone())
                    .push_bind(r.run_id.clone())
                    .push_bind(r.state.clone())
                    .push_bind(r.ran_at)
                    .push_bind(r.counts.clone());
                q.push(")").push(super::$dialect::UPSERT_RECONCILIATION);
                q.build().execute(self.write_pool()).await?;
                Ok(())
            }

            async fn reconciliations_on(
                &self,
                day: &str,
                tenant: Option<&str>,
            ) -> Result<Vec<ReconciliationRow>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new("SELECT * FROM reconciliations WHERE day = ");
                q.push_bind(day.to_owned());
                if let Some(tenant) = tenant {
                    q.push(" AND tenant = ").push_bind(tenant.to_owned());
                }
                q.push(" ORDER BY tenant");
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn partial_days(&self, since: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT tenant, day FROM reconciliations WHERE state = 'partial' AND day >= ",
                );
                q.push_bind(since.to_owned()).push(" ORDER BY day, tenant");
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn exceptions_of(&self, run_id: &str, limit: i64) -> Result<Vec<ExceptionRow>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT kind, number, class, ours, channel, action FROM reconciliation_exceptions WHERE run_id = ",
                );
                q.push_bind(run_id.to_owned()).push(" ORDER BY kind, number LIMIT ").push_bind(limit);
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn new_exceptions(
                &self,
                run_id: &str,
                previous: &str,
                limit: i64,
            ) -> Result<Vec<ExceptionRow>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new(
                    "SELECT e.kind, e.number, e.class, e.ours, e.channel, e.action FROM reconciliation_exceptions e \
                     WHERE e.run_id = ",
                );
                q.push_bind(run_id.to_owned());
                q.push(
                    " AND NOT EXISTS (SELECT 1 FROM reconciliation_exceptions p WHERE p.kind = e.kind \
                     AND p.number = e.number AND p.class = e.class AND p.run_id = ",
                );
                q.push_bind(previous.to_owned()).push(") ORDER BY e.kind, e.number LIMIT ").push_bind(limit);
                q.build_query_as().fetch_all(self.pool()).await
            }

            async fn stale_scratch(&self, tenant: &str, day: &str) -> Result<Vec<String>, sqlx::Error> {
                let mut q = QueryBuilder::<$db>::new("SELECT s.id FROM reconciliation_scratch s WHERE s.tenant = ");
                q.push_bind(tenant.to_owned()).push(" AND s.day = ").push_bind(day.to_owned());
                q.push(" AND NOT EXISTS (SELECT 1 FROM statement_copies c WHERE c.copy_id = s.id)");
                q.push(" AND NOT EXISTS (SELECT 1 FROM reconciliations r WHERE r.run_id = s.id)");
                q.build_query_scalar().fetch_all(self.pool()).await
            }

            async fn delete_scratch(&self, id: &str, limit: i64) -> Result<u64, sqlx::Error> {
                for sql in [super::$dialect::DELETE_LINES, super::$dialect::DELETE_EXCEPTIONS] {
                    let mut q = QueryBuilder::<$db>::new(sql.0);
                    q.push_bind(id.to_owned()).push(sql.1).push_bind(limit).push(sql.2);
                    let done = q.build().execute(self.write_pool()).await?.rows_affected();
                    if done > 0 {
                        return Ok(done);
                    }
                }
                let mut q = QueryBuilder::<$db>::new("DELETE FROM reconciliation_scratch WHERE id = ");
                q.push_bind(id.to_owned()).build().execute(self.write_pool()).await?;
                Ok(0)
            }
        }
    };
}

channel_word_store!(onceflow_engine::PgStore, sqlx::Postgres, postgres);
channel_word_store!(onceflow_engine::SqliteStore, sqlx::Sqlite, sqlite);
channel_word_store!(onceflow_engine::MySqlStore, sqlx::MySql, mysql);
