//! The leader-churn phase's holder (see [`crate::churn`]): a process of
//! its own, so that the harness kills it by pid as a crash would.

use std::time::Duration;

use latchkey_check::history::{ops, ChurnRole};
use latchkey_check::EventKind;

use super::Ctx;
use crate::clock::now_ns;

/// The lock the holder takes and the waiter queues for.
pub const CHURN_LOCK: &str = "churn/abandoned";
/// How long the holder tries to take the lock.
const ACQUIRE_WITHIN: Duration = Duration::from_secs(20);
/// How often the holder looks whether its client vouches for a longer
/// lease (a keep-alive acknowledged).
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Opens a session with the worker's TTL, takes [`CHURN_LOCK`], records
/// the grant, then records every lease its client vouches for (the send
/// of its last acknowledged keep-alive plus the TTL, less the client's
/// margin), as each keep-alive is acknowledged, until it is killed. It
/// never releases: the harness SIGKILLs it holding the lock.
pub async fn holder_task(ctx: &Ctx, process: u64) {
    let ttl = Duration::from_millis(ctx.args.ttl_ms);
    let session = loop {
        match ctx.client.session(ttl).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::debug!(%e, "cannot open the churn holder's session yet");
                if ctx.stopping() {
                    return;
                }
                ctx.pace().await;
            }
        }
    };
    let holder = format!("p{process}/s{}", session.id());
    let ttl_ms = ctx.args.ttl_ms;
    let acquire = |token| ops::churn_acquire(CHURN_LOCK, &holder, ChurnRole::Holder, ttl_ms, token);
    ctx.rec.invoke(process, acquire(None));
    let guard = match session
        .lock(CHURN_LOCK)
        .acquire_timeout(ACQUIRE_WITHIN)
        .await
    {
        Ok(Some(g)) => g,
        Ok(None) => {
            ctx.rec.record(process, EventKind::Unknown, acquire(None));
            tracing::error!("the churn holder was not granted {CHURN_LOCK} in time");
            return;
        }
        Err(e) => {
            ctx.rec.record(process, EventKind::Unknown, acquire(None));
            tracing::error!(%e, "the churn holder's acquire failed");
            return;
        }
    };
    ctx.rec.record(
        process,
        EventKind::Ok,
        acquire(Some(u64::from(guard.token()))),
    );
    let mut vouched = None;
    while !ctx.stopping() {
        let until = session.valid_until();
        if vouched != Some(until) && session.is_live() {
            // The lease clock counts like CLOCK_MONOTONIC on a machine
            // that does not suspend: its end on the recorder's clock.
            let left = session.remaining();
            ctx.rec.record(
                process,
                EventKind::Ok,
                ops::churn_vouched(CHURN_LOCK, &holder, now_ns().saturating_add(nanos(left))),
            );
            vouched = Some(until);
        }
        let mut stop = ctx.stop.clone();
        let _ = tokio::time::timeout(LOOK_EVERY, stop.wait_for(|s| *s)).await;
    }
    // Told to stop before the harness killed it (the harness is going
    // away): let go.
    let _ = guard.release().await;
    let _ = session.close().await;
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
