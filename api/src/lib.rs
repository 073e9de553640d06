//! torpor's node-local APIs.
//!
//! - [`store`]: the snapshot store API that `torpor-snapshotter` serves on
//!   `/run/torpor/store.sock` (ttrpc over a root-only unix socket), used by
//!   the shim and by `torporctl` (see `proto/torpor/store/v1/store.proto`).
//! - [`control`]: the control API each shim serves on
//!   `/run/torpor/shims/<shim id>.sock`, used by `torporctl` (see
//!   `proto/torpor/control/v1/control.proto`).
//! - [`ids`]: actor ids and snapshot references (`actor@generation`), the
//!   one parser of them.
//! - [`annotations`]: the pod annotations of torpor's agent and kubectl
//!   plugin, which the shim passes over.

pub mod annotations;
pub mod control;
pub mod ids;

/// Default path of the store API socket.
pub const STORE_SOCKET: &str = "/run/torpor/store.sock";

/// Environment variable that overrides [`STORE_SOCKET`] for the shim and
/// torporctl (the test rig runs a private daemon per rig).
pub const STORE_SOCKET_ENV: &str = "TORPOR_STORE_SOCKET";

/// The store API socket to use: `$TORPOR_STORE_SOCKET` or [`STORE_SOCKET`].
pub fn store_socket() -> std::path::PathBuf {
    std::env::var_os(STORE_SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(STORE_SOCKET))
}

/// torpor.store.v1: messages and the ttrpc client/server of the Store service.
pub mod store {
    /// Generated code (the ttrpc module refers to the messages as `super::store`).
    #[allow(warnings, clippy::all, missing_docs)]
    mod generated {
        pub mod store {
            include!(concat!(env!("OUT_DIR"), "/store/store.rs"));
        }
        pub mod store_ttrpc {
            include!(concat!(env!("OUT_DIR"), "/store/store_ttrpc.rs"));
        }
    }
    pub use generated::store::*;
    pub use generated::store_ttrpc::{create_store, Store, StoreClient};
}

pub use protobuf;
pub use ttrpc;
