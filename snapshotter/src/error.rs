//! The daemon's error type and its mapping onto gRPC status codes.

use std::path::PathBuf;

use containerd_snapshots::tonic::Status;

/// Everything that can go wrong in the daemon (config, sockets, snapshotter).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A snapshot (or its parent) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A snapshot key or name is already taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is valid but the snapshot is in the wrong state for it
    /// (commit of a view, remove of a parent, mounts of a committed snapshot).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request itself is malformed (bad filter, bad field path, bad label).
    #[error("{0}")]
    InvalidArgument(String),
    /// An I/O operation failed; `op` says what was being done, `path` where.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The metadata database failed.
    #[error("metadata database {}: {msg}", path.display())]
    Db { path: PathBuf, msg: String },
    /// The metadata database holds something this version cannot read.
    #[error("metadata database {}: corrupt record: {msg}", path.display())]
    Corrupt { path: PathBuf, msg: String },
    /// The configuration (file or flags) is invalid.
    #[error("config: {0}")]
    Config(String),
    /// Anything else that stops the daemon from starting or serving.
    #[error("{0}")]
    Daemon(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error with the operation and the path it was about.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }

    /// Builds an `Error::Io` from a nix errno.
    pub fn nix(op: &'static str, path: impl Into<PathBuf>, errno: nix::errno::Errno) -> Self {
        Error::io(op, path, std::io::Error::from_raw_os_error(errno as i32))
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::NotFound(_) => Status::not_found(msg),
            Error::AlreadyExists(_) => Status::already_exists(msg),
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::InvalidArgument(_) | Error::Config(_) => Status::invalid_argument(msg),
            Error::Io { .. } | Error::Db { .. } | Error::Corrupt { .. } | Error::Daemon(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_snapshots::tonic::Code;

    #[test]
    fn codes_map_onto_grpc() {
        let cases = [
            (Error::NotFound("x".into()), Code::NotFound),
            (Error::AlreadyExists("x".into()), Code::AlreadyExists),
            (Error::FailedPrecondition("x".into()), Code::FailedPrecondition),
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::io("open", "/p", std::io::Error::other("boom")), Code::Internal),
        ];
        for (e, code) in cases {
            let s: Status = e.into();
            assert_eq!(s.code(), code);
        }
        let s: Status = Error::io("open", "/some/path", std::io::Error::from_raw_os_error(libc::ENOENT)).into();
        assert!(s.message().contains("open /some/path"), "{}", s.message());
    }
}
