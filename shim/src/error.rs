//! Maps runtime errors onto the ttrpc codes containerd expects.

use containerd_shim::protos::ttrpc::{self, Code};
use torpor_runtime::{Error, StoreErrorKind};

/// Converts a runtime error into a ttrpc status with the matching code.
pub fn to_ttrpc(e: Error) -> ttrpc::Error {
    let code = match &e {
        Error::InvalidAnnotation { .. } | Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
        Error::NotFound(_) => Code::NOT_FOUND,
        Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
        Error::FailedPrecondition(_) | Error::WrongState(_) => Code::FAILED_PRECONDITION,
        Error::Corrupt(_) => Code::DATA_LOSS,
        Error::Store { kind, .. } => match kind {
            StoreErrorKind::NotFound => Code::NOT_FOUND,
            StoreErrorKind::InvalidArgument => Code::INVALID_ARGUMENT,
            StoreErrorKind::LeaseHeld | StoreErrorKind::LeaseLost | StoreErrorKind::FailedPrecondition => Code::FAILED_PRECONDITION,
            StoreErrorKind::Corrupt => Code::DATA_LOSS,
            StoreErrorKind::Unimplemented => Code::UNIMPLEMENTED,
            StoreErrorKind::Unavailable | StoreErrorKind::Other => Code::UNAVAILABLE,
        },
        Error::Io { .. } | Error::Sys { .. } | Error::Runc { .. } | Error::Json { .. } => Code::UNKNOWN,
    };
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
}

/// Shorthand for handlers: `rt.op().await.map_err(to_ttrpc)?`.
pub trait IntoTtrpc<T> {
    fn ttrpc(self) -> ttrpc::Result<T>;
}

impl<T> IntoTtrpc<T> for torpor_runtime::Result<T> {
    fn ttrpc(self) -> ttrpc::Result<T> {
        self.map_err(to_ttrpc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: Error) -> Code {
        match to_ttrpc(e) {
            ttrpc::Error::RpcStatus(s) => s.code(),
            other => panic!("not a status: {other:?}"),
        }
    }

    #[test]
    fn codes() {
        assert_eq!(code(Error::NotFound("x".into())), Code::NOT_FOUND);
        assert_eq!(code(Error::AlreadyExists("x".into())), Code::ALREADY_EXISTS);
        assert_eq!(code(Error::FailedPrecondition("x".into())), Code::FAILED_PRECONDITION);
        assert_eq!(code(Error::store(StoreErrorKind::LeaseLost, "x")), Code::FAILED_PRECONDITION);
        assert_eq!(code(Error::store(StoreErrorKind::NotFound, "x")), Code::NOT_FOUND);
        assert_eq!(code(Error::store(StoreErrorKind::Corrupt, "x")), Code::DATA_LOSS);
        assert_eq!(code(Error::store(StoreErrorKind::Unavailable, "x")), Code::UNAVAILABLE);
        let bad =
            Error::InvalidAnnotation { key: "torpor.dev/idle-after".into(), value: "banana".into(), reason: "expected a duration".into() };
        match to_ttrpc(bad) {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), Code::INVALID_ARGUMENT);
                assert!(s.message().contains("torpor.dev/idle-after"));
            }
            other => panic!("{other:?}"),
        }
    }
}
