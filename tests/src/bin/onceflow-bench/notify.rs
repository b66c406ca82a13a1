//! `notify/postgres`: signed channel notifications taken by `POST /v1/channel/notifications` while the usual HTTP
//! payment load runs against the same `onceflow serve` on Postgres, beside the payment rate of the same window.
//!
//! Two servers in one invocation, each on a fresh database with the same flags (`--channel-notify-secrets`):
//! `notify/postgres solo` pays with no notifications, then `notify/postgres` pays the same way while a second set
//! of `concurrency` client tasks posts notifications for as long as the payments run. Each notification has an id
//! of its own and names a number onceflow does not hold (`charge.succeeded` of `nx<k>`), so each is verified,
//! recorded durably before its `204`, and delivered as `unheld` evidence; none of them touches the payments. At
//! the end every notification answered `204` must be a row of `channel_notifications`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use onceflow_payments::signature;

use super::http::{self, Server};
use super::measure::Run;
use super::options::Options;

/// The channel merchant of tenant `default` (its name) and the secret its notifications are signed with.
const MERCHANT: &str = "default";
const SECRET: &str = "whsec_bench";

/// What the scenario measured: payments without notifications, payments with them, and the notifications taken
/// in the same window as the latter (a [`Run`] whose `done` counts notifications, `latencies_us` theirs).
pub(crate) struct Notified {
    pub(crate) solo: Run,
    pub(crate) loaded: Run,
    pub(crate) notifications: Run,
}

/// `onceflow serve` taking the merchant's notifications, on a fresh database `name` seeded for `o.count`
/// payments; with the database's URL.
async fn server(base: &str, name: &str, o: &Options) -> anyhow::Result<(Server, String)> {
    let secrets = format!("{MERCHANT}:{SECRET}");
    http::serve_seeded(base, name, o, &["--channel-notify-secrets", &secrets]).await
}

/// Runs both halves (see the module) on fresh databases of `base`'s server.
pub(crate) async fn postgres(base: &str, o: &Options) -> anyhow::Result<Notified> {
    let (solo_server, _) = server(base, "onceflow_bench_notify_solo", o).await?;
    let solo = http::run("notify/postgres solo", &solo_server, o).await?;
    drop(solo_server);

    let (loaded_server, loaded_url) = server(base, "onceflow_bench_notify", o).await?;
    let notifier = Notifier::start(loaded_server.base(), o)?;
    let loaded = http::run("notify/postgres", &loaded_server, o).await?;
    let (notifications, sent) = notifier.stop().await?;
    eprintln!(
        "  notify/postgres: {} notifications in {:.1} s beside {} payments",
        notifications.done, notifications.secs, loaded.done
    );

    let pool = sqlx::PgPool::connect(&loaded_url).await?;
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM channel_notifications WHERE merchant_id = $1 AND source = 'notification'")
            .bind(MERCHANT)
            .fetch_one(&pool)
            .await?;
    anyhow::ensure!(u64::try_from(rows)? == sent, "{sent} notifications answered 204, {rows} recorded");
    pool.close().await;
    drop(loaded_server);
    Ok(Notified { solo, loaded, notifications })
}

/// The second set of client tasks: signed notifications, one after another each, until stopped.
struct Notifier {
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Vec<u64>>>>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    started: Instant,
}

/// A `charge.succeeded` notification `k` for number `nx<k>`, which onceflow does not hold.
fn notification(k: u64) -> Vec<u8> {
    let body = serde_json::json!({
        "id": format!("ntf_bench_{k}"),
        "type": "charge.succeeded",
        "created_at": "2026-01-01T00:00:00Z",
        "merchant_id": MERCHANT,
        "data": {"merchant_request_no": format!("nx{k}"), "charge_id": format!("ch_nx{k}"), "order_no": format!("x{k}"),
            "amount": 1000, "currency": "CNY", "status": "succeeded"},
    });
    body.to_string().into_bytes()
}

fn now_secs() -> anyhow::Result<i64> {
    Ok(i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs())?)
}

impl Notifier {
    fn start(base: &str, o: &Options) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().pool_max_idle_per_host(usize::try_from(o.concurrency)?).build()?;
        let url = format!("{base}/v1/channel/notifications");
        let (stop, next, done) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(1)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        for _ in 0..o.concurrency {
            let (client, url, stop, next, done) =
                (client.clone(), url.clone(), stop.clone(), next.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let body = notification(k);
                    let t = Instant::now();
                    let signed = signature::header(&[SECRET], now_secs()?, &body);
                    let r = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("channel-signature", signed)
                        .body(body)
                        .send()
                        .await?;
                    let status = r.status();
                    anyhow::ensure!(status == 204, "notification {k}: {status} {}", r.text().await.unwrap_or_default());
                    latencies.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(latencies)
            }));
        }
        Ok(Self { tasks, stop, done, started: Instant::now() })
    }

    /// Stops the tasks: the notifications answered until now over the time since the start (the payments'
    /// window), and every notification answered `204`, those still in flight at the stop included.
    async fn stop(self) -> anyhow::Result<(Run, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let (done, secs) = (self.done.load(Ordering::Relaxed), self.started.elapsed().as_secs_f64());
        let mut latencies_us = Vec::new();
        for t in self.tasks {
            latencies_us.extend(t.await??);
        }
        let sent = self.done.load(Ordering::Relaxed);
        Ok((Run { name: "notifications", done, secs, latencies_us, rss_kib: None }, sent))
    }
}
