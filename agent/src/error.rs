//! The crate's error type.

/// What went wrong in the agent or the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
    /// The node's control sockets could not be listed.
    #[error("{0}")]
    Node(String),
    /// A command-line argument is wrong.
    #[error("{0}")]
    Usage(String),
    /// Refused: doing it would break something (the message says what).
    #[error("refused: {0}")]
    Refused(String),
    /// A wait ended without the state asked for.
    #[error("{0}")]
    Wait(String),
    /// I/O (the async runtime, a signal handler).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

impl Error {
    /// The process exit code of this error: 3 not found (an API 404),
    /// 4 refused (by torpor, or the API's 401/403), 2 usage, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Kube { source: kube::Error::Api(s), .. } if s.code == 404 => 3,
            Error::Kube { source: kube::Error::Api(s), .. } if s.code == 401 || s.code == 403 => 4,
            Error::Refused(_) => 4,
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
