//! Activation: a real inbound connection to a port held for the suspended
//! actor ([`crate::system::held_ports`]) resumes it. A wake-up that finds
//! the actor not suspended (already resumed, being resumed by another
//! trigger) is nothing to do; every other failure is logged.

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::error::Error;
use crate::lifecycle::Actor;

/// Resumes `actor` for every message on `wake`.
pub fn start(actor: &Actor, mut wake: mpsc::UnboundedReceiver<()>) {
    let actor = actor.clone();
    tokio::spawn(async move {
        while wake.recv().await.is_some() {
            match actor.resume().await {
                Ok(_) => info!("actor resumed by an inbound connection"),
                Err(Error::WrongState(_)) => {} // already resumed
                Err(e) => warn!("resume on an inbound connection failed: {e}"),
            }
        }
    });
}
