//! One reconciliation run: for each tenant, the day's statement copied, matched, and its results made current
//! at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::NaiveDate;
use serde_json::Value;

use super::classify::{self, Class, ours_of_compensation, ours_of_payment};
use super::view::{Reconciliation, reconciliations};
use crate::channel::{Channel, ChannelError, EntryKind, StatementLine};
use crate::model::{PaymentRecord, PaymentStatus};
use crate::notifications::ChannelAccounts;
use crate::service::Payments;
use crate::store::{ChannelWord, ExceptionRow, PaymentStore, ReconciliationRow, StagedLine, StatementCopy};

/// Lines staged per insert, and matched per batch.
const BATCH: usize = 500;
/// Exceptions newly found that one run logs, at most (the rest are counted in one line).
const LOGGED: i64 = 1_000;
/// Rows deleted per statement when a stale copy or run is cleared.
const DELETE_BATCH: i64 = 5_000;

/// Why a run did not finish; nothing of it was made current.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The database failed.
    #[error("storage unavailable")]
    Database(#[from] sqlx::Error),
    /// The channel's statement could not be read (down, broken off, unreadable).
    #[error("the channel's statement could not be read: {0}")]
    Channel(#[from] ChannelError),
}

/// What one run of one (tenant, day) came to.
#[derive(Debug, Clone, PartialEq)]
pub enum ReconcileReport {
    /// Reconciled; the results are current.
    Done(Reconciliation),
    /// The channel has no statement of the day yet (`404`): nothing recorded; tried again later.
    NoStatement {
        /// Whose.
        tenant: String,
        /// The day.
        date: String,
    },
}

/// Reconciles days of the tenants' statements against the payment service's records.
pub struct Reconciler<S: PaymentStore> {
    payments: Payments<S>,
    channel: Arc<dyn Channel>,
    accounts: ChannelAccounts,
    tenants: Vec<String>,
}

impl<S: PaymentStore> Clone for Reconciler<S> {
    fn clone(&self) -> Self {
        Self {
            payments: self.payments.clone(),
            channel: self.channel.clone(),
            accounts: self.accounts.clone(),
            tenants: self.tenants.clone(),
        }
    }
}

/// The day as stored: `YYYY-MM-DD`.
fn text(day: NaiveDate) -> String {
    day.format("%Y-%m-%d").to_string()
}

/// Milliseconds since the epoch at the start of the UTC `day`.
fn start_ms(day: NaiveDate) -> i64 {
    day.and_hms_opt(0, 0, 0).map_or(0, |t| t.and_utc().timestamp_millis())
}

/// The copies of a day's neighbours, read on demand: `None` until needed, `Some(None)` when the channel has no
/// statement of that day (yet).
struct Around {
    before: Option<Option<StatementCopy>>,
    after: Option<Option<StatementCopy>>,
}

impl<S: PaymentStore> Reconciler<S> {
    /// Reconciles `tenants`' statements from `channel` (each tenant's merchant id from `accounts`) against
    /// `payments`' records, on its store and clock.
    pub fn new(
        payments: Payments<S>,
        channel: Arc<dyn Channel>,
        accounts: ChannelAccounts,
        tenants: Vec<String>,
    ) -> Self {
        Self { payments, channel, accounts, tenants }
    }

    /// The tenants it reconciles.
    pub fn tenants(&self) -> &[String] {
        &self.tenants
    }

    fn store(&self) -> &S {
        self.payments.engine().store()
    }

    pub(super) fn store_ref(&self) -> &S {
        self.store()
    }

    fn now(&self) -> i64 {
        self.payments.engine().now_ms()
    }

    /// The engine's clock's UTC day.
    pub fn today(&self) -> NaiveDate {
        chrono::DateTime::from_timestamp_millis(self.now()).unwrap_or_default().date_naive()
    }

    /// Reconciles `day` for `tenant` (every tenant when `None`), one process at a time: `None` when another
    /// process holds the reconciliation's lock. A tenant whose run fails is reported as the error, after the
    /// others ran.
    pub async fn run_day(
        &self,
        day: NaiveDate,
        tenant: Option<&str>,
    ) -> Result<Option<Vec<ReconcileReport>>, ReconcileError> {
        let Some(lock) = self.store().lock_reconcile().await? else {
            tracing::debug!("another process is reconciling");
            return Ok(None);
        };
        let tenants: Vec<String> = match tenant {
            Some(t) => vec![t.to_owned()],
            None => self.tenants.clone(),
        };
        let mut reports = Vec::new();
        let mut failed = None;
        for tenant in &tenants {
            match self.reconcile(tenant, day).await {
                Ok(report) => reports.push(report),
                Err(e) => {
                    tracing::warn!(%tenant, day = %text(day), error = %e, "reconciliation failed; nothing of it was kept");
                    failed = Some(e);
                }
            }
        }
        if let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "could not release the reconciliation lock: its connection was closed");
        }
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!("onceflow_reconciliation_last_run_timestamp_seconds").set(self.now() as f64 / 1000.0);
        match failed {
            Some(e) => Err(e),
            None => Ok(Some(reports)),
        }
    }

    /// One tenant's day: its statement copied, matched, and the results made current.
    async fn reconcile(&self, tenant: &str, day: NaiveDate) -> Result<ReconcileReport, ReconcileError> {
        let store = self.store();
        let day_text = text(day);
        self.clear_stale(tenant, &day_text).await?;
        let Some(copy) = self.fetch_copy(tenant, day).await? else {
            tracing::info!(%tenant, day = %day_text, "the channel has no statement of this day yet");
            return Ok(ReconcileReport::NoStatement { tenant: tenant.to_owned(), date: day_text });
        };
        let run_id = format!("run_{}", uuid::Uuid::new_v4().simple());
        store.begin_scratch(&run_id, tenant, &day_text, self.now()).await?;
        let mut around = Around { before: None, after: None };
        let mut counts: BTreeMap<Class, u64> = BTreeMap::new();
        let mut complete = copy.complete == 1;

        // 1. Every line of the day's statement, in batches of the copy's key order (charges, then refunds).
        for kind in [EntryKind::Charge, EntryKind::Refund] {
            let mut after = String::new();
            loop {
                let lines = store.lines_after(&copy.copy_id, kind.as_str(), &after, BATCH as i64).await?;
                let Some(last) = lines.last() else { break };
                after = last.number.clone();
                let exceptions = self.match_lines(tenant, day, &copy, &mut around, &lines, &mut counts).await?;
                store.insert_exceptions(&run_id, &exceptions).await?;
            }
        }

        // 2. Every final outcome of ours that day with no line in it: looked for across midnight first.
        let (from, to) = (start_ms(day), start_ms(day.succ_opt().unwrap_or(day)));
        let mut after = String::new();
        loop {
            let ours = store.succeeded_between(tenant, from, to, &after, BATCH as i64).await?;
            let Some(last) = ours.last() else { break };
            after = last.request_no.to_string();
            let numbers: Vec<String> = ours.iter().map(|p| p.request_no.to_string()).collect();
            let in_day: HashSet<String> = store
                .lines_numbered(&copy.copy_id, EntryKind::Charge.as_str(), &numbers)
                .await?
                .into_iter()
                .map(|l| l.number)
                .collect();
            let unlined: Vec<&PaymentRecord> =
                ours.iter().filter(|p| !in_day.contains(p.request_no.as_str())).collect();
            if unlined.is_empty() {
                continue;
            }
            let numbers: Vec<String> = unlined.iter().map(|p| p.request_no.to_string()).collect();
            let (elsewhere, decided) = self.found_around(tenant, day, &mut around, EntryKind::Charge, &numbers).await?;
            let mut exceptions = Vec::new();
            for p in unlined {
                if elsewhere.contains_key(p.request_no.as_str()) {
                    // Counted on the neighbour's day, where its line is.
                    continue;
                }
                if !(decided && complete) {
                    // A statement that may still get it is not complete: not concluded yet.
                    complete = false;
                    continue;
                }
                *counts.entry(Class::MissingAtChannel).or_default() += 1;
                exceptions.push(ExceptionRow {
                    kind: EntryKind::Charge.as_str().into(),
                    number: p.request_no.to_string(),
                    class: Class::MissingAtChannel.as_str().into(),
                    ours: Some(ours_of_payment(p).to_string()),
                    channel: None,
                    action: Class::MissingAtChannel.action().into(),
                });
            }
            store.insert_exceptions(&run_id, &exceptions).await?;
        }
        // A day whose neighbours were needed and are not complete stays partial too (found_around said so).
        let state = if complete && copy.complete == 1 { "complete" } else { "partial" };

        // 3. The results, current at once; then what is new is logged, and the previous run cleared.
        let previous = store.reconciliations_on(&day_text, Some(tenant)).await?.into_iter().next();
        let counted: BTreeMap<&str, u64> = counts.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        let row = ReconciliationRow {
            tenant: tenant.to_owned(),
            day: day_text.clone(),
            run_id: run_id.clone(),
            state: state.to_owned(),
            ran_at: self.now(),
            counts: serde_json::to_string(&counted).unwrap_or_default(),
        };
        store.set_reconciliation(&row).await?;
        self.log_new(tenant, &day_text, &run_id, previous.as_ref().map(|p| p.run_id.as_str())).await?;
        self.clear_stale(tenant, &day_text).await?;
        for class in Class::ALL.into_iter().filter(|c| *c != Class::Matched) {
            #[allow(clippy::cast_precision_loss)]
            let n = counts.get(&class).copied().unwrap_or(0) as f64;
            metrics::gauge!("onceflow_reconciliation_exceptions", "tenant" => tenant.to_owned(), "class" => class.as_str())
                .set(n);
        }
        let shown = reconciliations(store, &day_text, Some(tenant)).await?.into_iter().next();
        tracing::info!(%tenant, day = %day_text, state, counts = %row.counts, "reconciled");
        Ok(shown
            .map_or(ReconcileReport::NoStatement { tenant: tenant.to_owned(), date: day_text }, ReconcileReport::Done))
    }

    /// Classifies a batch of the day's lines; counts them and gives back the exceptions. A line that settles a
    /// payment still unknown or processing gets the statement's word recorded, once.
    async fn match_lines(
        &self,
        tenant: &str,
        day: NaiveDate,
        copy: &StatementCopy,
        around: &mut Around,
        staged: &[StagedLine],
        counts: &mut BTreeMap<Class, u64>,
    ) -> Result<Vec<ExceptionRow>, ReconcileError> {
        let store = self.store();
        let lines: Vec<(StatementLine, &StagedLine)> =
            staged.iter().filter_map(|s| StatementLine::parse(s.line.as_bytes()).ok().map(|l| (l, s))).collect();
        // The payments the batch names: a charge's own, a compensation refund's (`{request_no}-refund`).
        let mut numbers: Vec<String> = Vec::new();
        for (line, _) in &lines {
            match line.kind {
                EntryKind::Charge => numbers.push(line.merchant_request_no.clone()),
                EntryKind::Refund => {
                    if let Some(charge) = line.number().strip_suffix("-refund") {
                        numbers.push(charge.to_owned());
                    }
                }
            }
        }
        let payments: HashMap<String, PaymentRecord> = store
            .payments_numbered(tenant, &numbers)
            .await?
            .into_iter()
            .map(|p| (p.request_no.to_string(), p))
            .collect();
        // A failed payment whose charge the statement says went through: was it refunded by its compensation?
        let wanted: Vec<String> = lines
            .iter()
            .filter(|(l, _)| l.kind == EntryKind::Charge && l.status == "succeeded")
            .filter(|(l, _)| payments.get(&l.merchant_request_no).is_some_and(|p| p.status == PaymentStatus::Failed))
            .map(|(l, _)| format!("{}-refund", l.merchant_request_no))
            .collect();
        let mut refunded: HashMap<String, StagedLine> = store
            .lines_numbered(&copy.copy_id, "refund", &wanted)
            .await?
            .into_iter()
            .map(|l| (l.number.clone(), l))
            .collect();
        let missing: Vec<String> = wanted.iter().filter(|n| !refunded.contains_key(*n)).cloned().collect();
        if !missing.is_empty() {
            let (found, _) = self.found_around(tenant, day, around, EntryKind::Refund, &missing).await?;
            refunded.extend(found);
        }

        let mut exceptions = Vec::new();
        for (line, staged) in &lines {
            let (class, ours) = match line.kind {
                EntryKind::Charge => {
                    let p = payments.get(&line.merchant_request_no);
                    let compensated = p.is_some_and(|p| {
                        refunded
                            .get(&format!("{}-refund", p.request_no))
                            .is_some_and(|r| r.status == "succeeded" && r.amount == p.amount)
                    });
                    (classify::charge(line, p, compensated), p.map(ours_of_payment))
                }
                EntryKind::Refund => {
                    let p = line.number().strip_suffix("-refund").and_then(|charge| payments.get(charge));
                    (classify::refund(line, p), p.map(ours_of_compensation))
                }
            };
            *counts.entry(class).or_default() += 1;
            if class == Class::Matched {
                continue;
            }
            if class == Class::Resolved {
                self.record_statement_word(tenant, day, line, staged).await?;
            }
            exceptions.push(ExceptionRow {
                kind: line.kind.as_str().into(),
                number: line.number().to_owned(),
                class: class.as_str().into(),
                ours: ours.map(|o: Value| o.to_string()),
                channel: Some(staged.line.clone()),
                action: class.action().into(),
            });
        }
        Ok(exceptions)
    }

    /// Records the statement's word on a payment still unknown or processing, as a notification is recorded:
    /// once (its id is the day, kind and number), for the workflow holding the number to apply.
    async fn record_statement_word(
        &self,
        tenant: &str,
        day: NaiveDate,
        line: &StatementLine,
        staged: &StagedLine,
    ) -> Result<(), ReconcileError> {
        let word = ChannelWord {
            merchant_id: self.accounts.merchant_of(tenant).to_owned(),
            notification_id: format!("statement:{}:{}:{}", text(day), line.kind.as_str(), line.number()),
            source: "statement".into(),
            tenant: tenant.to_owned(),
            kind: line.kind.as_str().into(),
            number: line.number().to_owned(),
            status: line.status.clone(),
            amount: line.amount,
            body: staged.line.clone(),
            received_at: self.now(),
            applied_at: None,
            outcome: None,
        };
        self.store().record_word(&word).await?;
        Ok(())
    }

    /// The lines of `kind` among `numbers` in the statements of the day before and after (read if not yet
    /// copied complete), and whether both those statements are complete (so a number in neither is in none).
    async fn found_around(
        &self,
        tenant: &str,
        day: NaiveDate,
        around: &mut Around,
        kind: EntryKind,
        numbers: &[String],
    ) -> Result<(HashMap<String, StagedLine>, bool), ReconcileError> {
        let mut found = HashMap::new();
        let mut decided = true;
        for (slot, neighbour) in [(&mut around.before, day.pred_opt()), (&mut around.after, day.succ_opt())] {
            let Some(neighbour) = neighbour else { continue };
            if slot.is_none() {
                let kept = self.store().copy_of(tenant, &text(neighbour)).await?;
                *slot = Some(match kept {
                    Some(copy) if copy.complete == 1 => Some(copy),
                    _ => self.fetch_copy(tenant, neighbour).await?,
                });
            }
            match slot.as_ref().and_then(Option::as_ref) {
                Some(copy) => {
                    decided &= copy.complete == 1;
                    for line in self.store().lines_numbered(&copy.copy_id, kind.as_str(), numbers).await? {
                        found.insert(line.number.clone(), line);
                    }
                }
                None => decided = false,
            }
        }
        Ok((found, decided))
    }

    /// Reads the tenant's statement of `day` into a new copy and makes it current; `None` for a `404`. A read
    /// that fails leaves the copy unreferenced (cleared by a later run) and the current one as it was.
    async fn fetch_copy(&self, tenant: &str, day: NaiveDate) -> Result<Option<StatementCopy>, ReconcileError> {
        let store = self.store();
        let merchant = self.accounts.merchant_of(tenant);
        let Some(mut statement) = self.channel.statement(merchant, day).await? else {
            return Ok(None);
        };
        let day_text = text(day);
        let copy_id = format!("copy_{}", uuid::Uuid::new_v4().simple());
        store.begin_scratch(&copy_id, tenant, &day_text, self.now()).await?;
        let mut batch = Vec::with_capacity(BATCH);
        let mut lines = 0i64;
        while let Some(line) = statement.next_line().await? {
            lines += 1;
            batch.push(StagedLine {
                kind: line.kind.as_str().into(),
                number: line.number().to_owned(),
                status: line.status.clone(),
                amount: line.amount,
                line: serde_json::to_string(&line).unwrap_or_default(),
            });
            if batch.len() == BATCH {
                store.stage_lines(&copy_id, &dedup(std::mem::take(&mut batch))).await?;
            }
        }
        store.stage_lines(&copy_id, &dedup(batch)).await?;
        store.analyze_lines().await?;
        let copy = StatementCopy {
            tenant: tenant.to_owned(),
            day: day_text.clone(),
            copy_id,
            complete: i64::from(statement.complete),
            line_count: lines,
            fetched_at: self.now(),
        };
        store.set_copy(&copy).await?;
        self.clear_stale(tenant, &day_text).await?;
        Ok(Some(copy))
    }

    /// Deletes the copies and runs of (tenant, day) that are not current: a previous one, or one a stopped run
    /// left.
    async fn clear_stale(&self, tenant: &str, day: &str) -> Result<(), ReconcileError> {
        for id in self.store().stale_scratch(tenant, day).await? {
            while self.store().delete_scratch(&id, DELETE_BATCH).await? > 0 {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }

    /// Logs each exception this run found that the previous run of the day did not (so a run again, or the
    /// hourly one, logs nothing twice).
    async fn log_new(
        &self,
        tenant: &str,
        day: &str,
        run_id: &str,
        previous: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let fresh = self.store().new_exceptions(run_id, previous.unwrap_or(""), LOGGED + 1).await?;
        for e in fresh.iter().take(usize::try_from(LOGGED).unwrap_or(usize::MAX)) {
            tracing::warn!(%tenant, %day, class = %e.class, kind = %e.kind, number = %e.number, action = %e.action,
                ours = e.ours.as_deref().unwrap_or("-"), channel = e.channel.as_deref().unwrap_or("-"),
                "reconciliation exception");
        }
        if fresh.len() > usize::try_from(LOGGED).unwrap_or(usize::MAX) {
            tracing::warn!(%tenant, %day, "more reconciliation exceptions than logged: see GET /v1/reconciliations");
        }
        Ok(())
    }

    /// The reconciliations of `day` (of `tenant` only, when given).
    pub async fn read(&self, day: NaiveDate, tenant: Option<&str>) -> Result<Vec<Reconciliation>, sqlx::Error> {
        reconciliations(self.store(), &text(day), tenant).await
    }
}

/// A batch without its repeated entries (the database drops the repeats of earlier batches).
fn dedup(mut batch: Vec<StagedLine>) -> Vec<StagedLine> {
    let mut seen = HashSet::new();
    batch.retain(|l| seen.insert((l.kind.clone(), l.number.clone())));
    batch
}
