//! A store's writers (`Store::writer`) on Postgres are connections it keeps out of its pool and hands from one
//! caller to the next. A caller whose call was dropped midway (its future cancelled: a timeout, a shutdown) has
//! left its answer on the way; the next caller must not be given the connection with that answer still to come,
//! or it reads another call's answer — an error raised by another commit's check — as its own.

use std::time::Duration;

use onceflow_engine::Store;

/// The answer to the dropped call, an error, arrives while its connection is idle; every later writer call is
/// answered its own outcome.
#[cfg_attr(onceflow_no_postgres, ignore = "DATABASE_URL is not set")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_midway_does_not_answer_the_next_caller() {
    let Some(store) = onceflow_tests::pg_store().await.unwrap() else { return };
    let mut w = store.writer().await.unwrap();
    // A division by zero once a 300 ms sleep is over (`random()` keeps it from being raised while planning); the
    // caller gives up after 50 ms.
    let slow = sqlx::query("SELECT 1 / ($1 * (1 + random()))::int FROM pg_sleep(0.3)").bind(0_i32).execute(&mut *w);
    assert!(tokio::time::timeout(Duration::from_millis(50), slow).await.is_err(), "the call was not cut short");
    drop(w);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The connection given back is the next one taken (the idle writers are a stack); take a few to be sure.
    let mut writers = Vec::new();
    for i in 0..4 {
        let mut w = store.writer().await.unwrap();
        let answer = sqlx::query_scalar::<_, i32>("SELECT $1").bind(i).fetch_one(&mut *w).await;
        let answer = w.check(answer);
        assert!(matches!(answer, Ok(v) if v == i), "writer {i} was answered another call's outcome: {answer:?}");
        writers.push(w);
    }
}
