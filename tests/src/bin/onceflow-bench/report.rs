//! What the bench prints at the end: the table of every scenario against the baselines, the paired rounds'
//! ratios, the MySQL scenarios against their own floor, the storms, the notifications taken under load, and the
//! rates with and without webhooks or tracing.

use std::time::Duration;

use super::events::Checked;
use super::measure::Run;
use super::tracing::Exports;

/// Every scenario's payments/s, latencies and ratios to `seed_pay` and `floor_pay`.
pub(crate) fn table(runs: &[Run], seed: f64, floor: f64) {
    println!();
    println!(
        "{:<20} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "scenario", "payments", "payments/s", "p50 ms", "p99 ms", "x floor", "x seed", "peak RSS"
    );
    println!(
        "{:<20} {:>9} {:>11.0} {:>9} {:>9} {:>9.2} {:>9.2} {:>10}",
        "seed_pay (pgbench)",
        "",
        seed,
        "",
        "",
        seed / floor,
        1.0,
        ""
    );
    println!(
        "{:<20} {:>9} {:>11.0} {:>9} {:>9} {:>9.2} {:>9.2} {:>10}",
        "floor_pay (pgbench)",
        "",
        floor,
        "",
        "",
        1.0,
        floor / seed,
        ""
    );
    for r in runs {
        let rss = r.rss_kib.map_or(String::new(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        println!(
            "{:<20} {:>9} {:>11.0} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>10}",
            r.name,
            r.done,
            r.rate(),
            r.percentile_ms(0.50),
            r.percentile_ms(0.99),
            r.rate() / floor,
            r.rate() / seed,
            rss
        );
    }
}

/// The `library/postgres` x `floor_pay` ratio of each paired round, in order, and their median (with more than
/// one round).
pub(crate) fn paired(mut paired: Vec<f64>) {
    if paired.len() > 1 {
        let shown: Vec<String> = paired.iter().map(|r| format!("{r:.2}")).collect();
        paired.sort_by(f64::total_cmp);
        println!(
            "\nlibrary/postgres x floor_pay in {} paired rounds: {} (median {:.2})",
            paired.len(),
            shown.join(", "),
            paired[paired.len() / 2]
        );
    }
}

/// The MySQL scenarios' payments/s against `floor_pay/mysql`'s `floor` from the same run.
pub(crate) fn mysql(rates: &[(&str, f64)], floor: f64) {
    let shown: Vec<String> =
        rates.iter().map(|(name, rate)| format!("{name} {rate:.0}/s = {:.2}x", rate / floor)).collect();
    println!(
        "\nagainst floor_pay/mysql ({floor:.0}/s, floor_pay's statements on the same MySQL): {}",
        shown.join(", ")
    );
}

/// Each backend's storm of `storm` concurrent requests under one token: its time and its channel charges.
pub(crate) fn storms(stormed: Vec<(&str, (Duration, usize))>, storm: u64) {
    for (backend, (storm_time, storm_charges)) in stormed {
        println!(
            "\n{backend}: {} concurrent requests with one token: all answered identically in {:.0} ms, {} channel \
             charge call(s)",
            storm,
            storm_time.as_secs_f64() * 1000.0,
            storm_charges
        );
    }
}

/// `notify/postgres`: the notifications taken while `notify/postgres` paid at `paid`/s, and that rate against
/// `solo`/s, the payments of `notify/postgres solo` (the same server and flags, no notifications).
pub(crate) fn notifications(notifications: &Run, paid: f64, solo: f64) {
    println!(
        "\nnotify/postgres: {} notifications taken in {:.1} s, {:.0}/s (p50 {:.1} ms, p99 {:.1} ms), beside {:.0} \
         payments/s in the same window: {:.2}x the {:.0} payments/s of notify/postgres solo (no notifications)",
        notifications.done,
        notifications.secs,
        notifications.rate(),
        notifications.percentile_ms(0.50),
        notifications.percentile_ms(0.99),
        paid,
        paid / solo,
        solo
    );
}

/// `events/postgres`: payments/s `with` one webhook endpoint subscribed against `without`, from the same run, and
/// what the receiver and the log showed.
pub(crate) fn events(c: &Checked, with: f64, without: f64) {
    println!(
        "\nevents/postgres: {with:.0} payments/s with one webhook endpoint subscribed, {without:.0}/s without: \
         {:.2}x. {} events in the log paged from start to end (one payment.succeeded per payment), all {} delivered \
         ({} deliveries) {:.1} s after the last payment; {} event(s) delivered more than once, {} delivery(ies) of \
         one attempt twice",
        with / without,
        c.logged,
        c.delivered,
        c.requests,
        c.drained.as_secs_f64(),
        c.repeated,
        c.doubled
    );
}

/// `tracing/postgres`: payments/s `with` traces exported against `without`, from the same run, and the export
/// requests the receiver got.
pub(crate) fn tracing(e: &Exports, with: f64, without: f64) {
    println!(
        "\ntracing/postgres: {with:.0} payments/s exporting traces over OTLP/HTTP, {without:.0}/s without: {:.2}x. \
         {} trace export requests by the end of the payments, {} ({:.1} MiB) {} s later",
        with / without,
        e.at_end,
        e.settled,
        e.bytes as f64 / 1_048_576.0,
        e.settle.as_secs()
    );
}
