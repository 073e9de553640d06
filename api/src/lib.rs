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

    use protobuf::Message;

    /// The `type_url` of the [`ErrorDetail`] in an error status's details.
    pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/torpor.store.v1.ErrorDetail";

    /// An error status of the store API: `code`, `message`, and `kind` in
    /// its details (an [`ErrorDetail`]).
    pub fn error_status(code: ttrpc::Code, message: impl ToString, kind: ErrorKind) -> ttrpc::proto::Status {
        let mut status = ttrpc::get_status(code, message);
        let mut detail = ErrorDetail::new();
        detail.kind = kind.into();
        let mut any = ttrpc::proto::Any::new();
        any.type_url = ERROR_DETAIL_TYPE_URL.to_string();
        // Encoding a message of one enum field cannot fail; an empty value
        // decodes as ERROR_KIND_UNSPECIFIED.
        any.value = detail.write_to_bytes().unwrap_or_default();
        status.details.push(any);
        status
    }

    /// The kind an error status of the store API carries: `None` when it
    /// carries none (a daemon from before it, an error of ttrpc itself) or
    /// one this build does not know.
    pub fn error_kind(status: &ttrpc::proto::Status) -> Option<ErrorKind> {
        let any = status.details.iter().find(|d| d.type_url == ERROR_DETAIL_TYPE_URL)?;
        let detail = ErrorDetail::parse_from_bytes(&any.value).ok()?;
        match detail.kind.enum_value().ok()? {
            ErrorKind::ERROR_KIND_UNSPECIFIED => None,
            kind => Some(kind),
        }
    }

    #[cfg(test)]
    mod tests {
        use protobuf::Enum;

        use super::*;

        #[test]
        fn an_error_kind_round_trips_through_a_status() {
            for kind in ErrorKind::VALUES.iter().copied().filter(|k| *k != ErrorKind::ERROR_KIND_UNSPECIFIED) {
                let status = error_status(ttrpc::Code::FAILED_PRECONDITION, "refused", kind);
                assert_eq!(status.code(), ttrpc::Code::FAILED_PRECONDITION);
                assert_eq!(status.message, "refused");
                assert_eq!(error_kind(&status), Some(kind));
                // As it crosses the wire.
                let decoded = ttrpc::proto::Status::parse_from_bytes(&status.write_to_bytes().unwrap()).unwrap();
                assert_eq!(error_kind(&decoded), Some(kind));
            }
        }

        #[test]
        fn a_status_without_a_kind_has_none() {
            assert_eq!(error_kind(&ttrpc::get_status(ttrpc::Code::FAILED_PRECONDITION, "old daemon")), None);
            let mut status = error_status(ttrpc::Code::NOT_FOUND, "x", ErrorKind::ERROR_KIND_UNSPECIFIED);
            assert_eq!(error_kind(&status), None);
            status.details[0].type_url = "type.googleapis.com/other.Detail".into();
            assert_eq!(error_kind(&status), None);
        }
    }
}

pub use protobuf;
pub use ttrpc;
