//! Activation: a real inbound connection to a port held for the suspended
//! actor ([`crate::system::held_ports`]) resumes it. A wake-up that finds
//! the actor not suspended (already resumed, being resumed by another
//! trigger) is nothing to do. A resume that fails is retried with backoff
//! (0.5 s doubling to 30 s) while connections keep arriving, so a restore
//! that cannot succeed (a fetch that fails) is not attempted once per
//! connection; the ports stay held meanwhile (the lifecycle holds them
//! again after a failed resume).

use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::actor::report::Trigger;
use crate::error::Error;
use crate::lifecycle::Actor;

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Resumes `actor` for the messages on `wake`.
pub fn start(actor: &Actor, mut wake: mpsc::UnboundedReceiver<()>) {
    let actor = actor.clone();
    tokio::spawn(async move {
        let mut backoff = FIRST_BACKOFF;
        while wake.recv().await.is_some() {
            loop {
                match actor.resume(Trigger::Connection).await {
                    Ok(_) => {
                        info!("actor resumed by an inbound connection");
                        backoff = FIRST_BACKOFF;
                    }
                    Err(Error::WrongState(_)) => {} // already resumed
                    Err(e) => {
                        warn!(retry_in = ?backoff, "resume on an inbound connection failed: {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        // Connections that came meanwhile: one more attempt.
                        if drain(&mut wake) > 0 {
                            continue;
                        }
                    }
                }
                break;
            }
            drain(&mut wake);
        }
    });
}

/// Takes every wake-up queued now; how many there were.
fn drain(wake: &mut mpsc::UnboundedReceiver<()>) -> usize {
    let mut n = 0;
    while wake.try_recv().is_ok() {
        n += 1;
    }
    n
}
