//! The checkout pins this node holds in the object tier: per pin object,
//! its bytes and when it was last written (`pin` writes, renews and
//! deletes them).

use std::time::Instant;

/// A pin this node holds: its bytes, and when it was last written.
pub(crate) struct PinState {
    pub(crate) bytes: Vec<u8>,
    pub(crate) renewed: Instant,
}
