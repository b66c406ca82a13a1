//! When `serve` and `worker` reconcile: the previous UTC day once a day at `--reconcile-at`, and the days still
//! `partial` (or not reconciled because the statement was not there yet) again, hourly, until complete.

use std::time::Duration;

use chrono::{NaiveDate, NaiveTime};

use super::Reconciler;
use crate::store::PaymentStore;

/// How far back unfinished days are taken up again.
const LOOK_BACK_DAYS: u64 = 7;
/// How often the unfinished days are tried again.
const HOURLY: Duration = Duration::from_secs(3600);

impl<S: PaymentStore> Reconciler<S> {
    /// Runs the daily reconciliation at `at` (UTC) and the hourly retries until aborted; each failure is logged
    /// and tried again at the next turn. One process at a time does the work (the others find the lock taken).
    pub fn spawn_daily(&self, at: NaiveTime) -> tokio::task::JoinHandle<()> {
        let reconciler = self.clone();
        tokio::spawn(async move {
            loop {
                let now = chrono::Utc::now();
                let today_at = now.date_naive().and_time(at).and_utc();
                let next_daily = if today_at > now { today_at } else { today_at + chrono::Duration::days(1) };
                let wait = (next_daily - now).to_std().unwrap_or_default().min(HOURLY);
                tokio::time::sleep(wait).await;
                reconciler.due(at).await;
            }
        })
    }

    /// What is due now: yesterday, once `at` has passed, if a tenant has no reconciliation of it; every day of
    /// the last week still `partial`.
    pub async fn due(&self, at: NaiveTime) {
        let now = chrono::Utc::now();
        let today = now.date_naive();
        let mut days: Vec<(Option<String>, NaiveDate)> = Vec::new();
        if let Some(yesterday) = today.pred_opt()
            && now.time() >= at
        {
            for tenant in self.tenants() {
                match self.read(yesterday, Some(tenant)).await {
                    Ok(found) if found.is_empty() => days.push((Some(tenant.clone()), yesterday)),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "could not read the reconciliations"),
                }
            }
        }
        let since = today - chrono::Duration::days(i64::try_from(LOOK_BACK_DAYS).unwrap_or(7));
        match self.store_partial_days(since).await {
            Ok(partial) => days.extend(partial.into_iter().map(|(t, d)| (Some(t), d))),
            Err(e) => tracing::warn!(error = %e, "could not read the partial reconciliations"),
        }
        for (tenant, day) in days {
            match self.run_day(day, tenant.as_deref()).await {
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(e) => tracing::warn!(error = %e, %day, "reconciliation failed; tried again within the hour"),
            }
        }
    }

    async fn store_partial_days(&self, since: NaiveDate) -> Result<Vec<(String, NaiveDate)>, sqlx::Error> {
        let rows = self.store_ref().partial_days(&since.format("%Y-%m-%d").to_string()).await?;
        Ok(rows
            .into_iter()
            .filter(|(t, _)| self.tenants().contains(t))
            .filter_map(|(t, d)| NaiveDate::parse_from_str(&d, "%Y-%m-%d").ok().map(|d| (t, d)))
            .collect())
    }
}
