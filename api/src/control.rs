//! torpor.control.v1: the API each shim serves on its control socket
//! (see `proto/torpor/control/v1/control.proto`), and the parts of its
//! contract that are not messages: the socket's place, the version, how a
//! failure's [`Reason`] travels in a ttrpc status, and how a connection in
//! the JSON protocol of torporctl before v1 is told apart and refused.

use std::path::PathBuf;

use protobuf::Message;

/// Generated code (the ttrpc module refers to the messages as `super::control`).
#[allow(warnings, clippy::all, missing_docs)]
mod generated {
    pub mod control {
        include!(concat!(env!("OUT_DIR"), "/control/control.rs"));
    }
    pub mod control_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/control/control_ttrpc.rs"));
    }
}
pub use generated::control::*;
pub use generated::control_ttrpc::{create_control, Control, ControlClient};

/// The API's name (its protobuf package).
pub const API: &str = "torpor.control.v1";
/// Additions made to v1 since its first release: 1, `Actor.freeze_tier`;
/// 2, `Actor.pod_uid`.
pub const REVISION: u32 = 2;
/// The type URL of [`ErrorDetail`] in a ttrpc status's details.
pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/torpor.control.v1.ErrorDetail";

/// Default directory of the shims' control sockets (root only).
pub const SOCKET_DIR: &str = "/run/torpor/shims";
/// Environment variable that overrides [`SOCKET_DIR`] (the test rig).
pub const SOCKET_DIR_ENV: &str = "TORPOR_SHIM_SOCKET_DIR";

/// The directory of the control sockets: `$TORPOR_SHIM_SOCKET_DIR` or [`SOCKET_DIR`].
pub fn socket_dir() -> PathBuf {
    std::env::var_os(SOCKET_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(SOCKET_DIR))
}

/// The [`ApiVersion`] this build serves.
pub fn api_version(shim_version: &str) -> ApiVersion {
    let mut v = ApiVersion::new();
    v.api = API.to_string();
    v.revision = REVISION;
    v.shim_version = shim_version.to_string();
    v
}

/// What a connection speaks, told by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A ttrpc frame: its header starts with the payload length as a
    /// big-endian u32, at most ttrpc's 4 MiB, so its first byte is 0.
    Ttrpc,
    /// A JSON request (`{"op": ...}`) of torporctl before v1.
    LegacyJson,
    /// Anything else.
    Unknown,
}

impl Protocol {
    pub fn sniff(first: u8) -> Protocol {
        match first {
            0 => Protocol::Ttrpc,
            b'{' | b' ' | b'\t' | b'\r' | b'\n' => Protocol::LegacyJson,
            _ => Protocol::Unknown,
        }
    }
}

/// What a shim answers, in one JSON line, to a connection that does not
/// speak ttrpc.
pub const LEGACY_REFUSAL: &str = "this shim speaks torpor.control.v1 (ttrpc); upgrade torporctl";

impl Reason {
    /// The ttrpc status code a failure of this reason is sent with.
    pub fn code(self) -> ttrpc::Code {
        use ttrpc::Code;
        match self {
            Reason::REASON_UNSPECIFIED | Reason::INTERNAL => Code::INTERNAL,
            Reason::INVALID_ARGUMENT => Code::INVALID_ARGUMENT,
            Reason::NOT_FOUND => Code::NOT_FOUND,
            Reason::ALREADY_IN_STATE => Code::ALREADY_EXISTS,
            Reason::WRONG_STATE | Reason::LEASE_LOST | Reason::LEASE_HELD => Code::FAILED_PRECONDITION,
            Reason::BUSY => Code::ABORTED,
            Reason::STORE_UNAVAILABLE => Code::UNAVAILABLE,
            Reason::CORRUPT => Code::DATA_LOSS,
            Reason::UNIMPLEMENTED => Code::UNIMPLEMENTED,
        }
    }

    /// The reason a status code stands for (when the detail's reason is
    /// one this build does not know).
    pub fn from_code(code: ttrpc::Code) -> Reason {
        use ttrpc::Code;
        match code {
            Code::INVALID_ARGUMENT => Reason::INVALID_ARGUMENT,
            Code::NOT_FOUND => Reason::NOT_FOUND,
            Code::ALREADY_EXISTS => Reason::ALREADY_IN_STATE,
            Code::FAILED_PRECONDITION => Reason::WRONG_STATE,
            Code::ABORTED => Reason::BUSY,
            Code::UNAVAILABLE => Reason::STORE_UNAVAILABLE,
            Code::DATA_LOSS => Reason::CORRUPT,
            Code::UNIMPLEMENTED => Reason::UNIMPLEMENTED,
            _ => Reason::INTERNAL,
        }
    }

    /// A few words for humans.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::REASON_UNSPECIFIED => "failed",
            Reason::INVALID_ARGUMENT => "invalid argument",
            Reason::NOT_FOUND => "not found",
            Reason::ALREADY_IN_STATE => "already in that state",
            Reason::WRONG_STATE => "not possible in the actor's state",
            Reason::BUSY => "another transition is under way",
            Reason::LEASE_LOST => "this node lost the actor's lease",
            Reason::LEASE_HELD => "another node holds the actor's lease",
            Reason::STORE_UNAVAILABLE => "the snapshot store is unavailable",
            Reason::CORRUPT => "a snapshot is corrupt",
            Reason::UNIMPLEMENTED => "not implemented by this shim",
            Reason::INTERNAL => "internal error",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            State::STATE_UNSPECIFIED => "UNKNOWN",
            State::RUNNING => "RUNNING",
            State::FROZEN => "FROZEN",
            State::SUSPENDING => "SUSPENDING",
            State::SUSPENDED => "SUSPENDED",
            State::RESUMING => "RESUMING",
        })
    }
}

/// A failed control call, as both sides see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: ttrpc::Code,
    pub reason: Reason,
    pub message: String,
    /// The actor's state when the call failed (UNSPECIFIED: unknown, or no actor).
    pub state: State,
    /// The actor id (empty: unknown, or no actor).
    pub actor: String,
}

impl Failure {
    pub fn new(reason: Reason, message: impl Into<String>) -> Failure {
        Failure { code: reason.code(), reason, message: message.into(), state: State::STATE_UNSPECIFIED, actor: String::new() }
    }

    /// The status the server answers with: the code, the message and an
    /// [`ErrorDetail`] in its details.
    pub fn into_status(self) -> ttrpc::Status {
        let mut detail = ErrorDetail::new();
        detail.reason = self.reason.into();
        detail.message = self.message.clone();
        detail.state = self.state.into();
        detail.actor = self.actor;
        let mut status = ttrpc::get_status(self.code, self.message);
        let mut any = ttrpc::proto::Any::new();
        any.type_url = ERROR_DETAIL_TYPE_URL.to_string();
        // Encoding a message into a Vec cannot fail but for a message over
        // 2 GiB; without the detail, the code still tells the reason.
        if let Ok(value) = detail.write_to_bytes() {
            any.value = value;
            status.details.push(any);
        }
        status
    }

    pub fn into_ttrpc(self) -> ttrpc::Error {
        ttrpc::Error::RpcStatus(self.into_status())
    }

    /// The failure a status carries: its [`ErrorDetail`], else (a status
    /// from ttrpc itself, or a detail that does not decode) its code.
    pub fn from_status(status: &ttrpc::Status) -> Failure {
        let code = status.code();
        let detail = status
            .details
            .iter()
            .filter(|a| a.type_url == ERROR_DETAIL_TYPE_URL)
            .find_map(|a| ErrorDetail::parse_from_bytes(&a.value).ok());
        match detail {
            Some(d) => Failure {
                code,
                // A reason added after this build: judged by its code.
                reason: d.reason.enum_value().unwrap_or_else(|_| Reason::from_code(code)),
                message: if d.message.is_empty() { status.message.clone() } else { d.message },
                state: d.state.enum_value_or_default(),
                actor: d.actor,
            },
            // A torpor.control.v1 server attaches a detail to every failure
            // of its own, so this status comes from the ttrpc layer, where
            // NOT_FOUND and UNIMPLEMENTED both mean that the shim lacks the
            // method or the service (the generated default method answers
            // NOT_FOUND "... is not supported").
            None if code == ttrpc::Code::NOT_FOUND => Failure {
                code,
                reason: Reason::UNIMPLEMENTED,
                message: status.message.clone(),
                state: State::STATE_UNSPECIFIED,
                actor: String::new(),
            },
            None => Failure {
                code,
                reason: Reason::from_code(code),
                message: status.message.clone(),
                state: State::STATE_UNSPECIFIED,
                actor: String::new(),
            },
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason.describe(), self.message)
    }
}

impl std::error::Error for Failure {}

/// The fuzzing entry point of the control API's decoding (fuzz target
/// `control`; its corpus is replayed by this crate's unit tests): `data` is
/// taken as what a control socket can receive or a client can be answered.
/// The protocol is sniffed from the first byte; then `data` is decoded as a
/// ttrpc request frame's body and, when it names a method of
/// torpor.control.v1, its payload as that method's request; as a response
/// (status and payload); and as each message on its own. A decoded failure
/// must survive its way back through a status. Never panics but on a
/// broken invariant.
pub fn fuzz_decode(data: &[u8]) {
    let _ = data.first().map(|b| Protocol::sniff(*b));
    if let Ok(req) = ttrpc::proto::Request::parse_from_bytes(data) {
        if req.service == format!("{API}.Control") {
            let p = &req.payload;
            let _ = match req.method.as_str() {
                "Status" => StatusRequest::parse_from_bytes(p).map(|_| ()),
                "Suspend" => SuspendRequest::parse_from_bytes(p).map(|_| ()),
                "Resume" => ResumeRequest::parse_from_bytes(p).map(|_| ()),
                "Freeze" => FreezeRequest::parse_from_bytes(p).map(|_| ()),
                _ => Ok(()),
            };
        }
    }
    if let Ok(resp) = ttrpc::proto::Response::parse_from_bytes(data) {
        if let Some(status) = resp.status.as_ref() {
            let f = Failure::from_status(status);
            let _ = f.to_string();
            let back = Failure::from_status(&f.clone().into_status());
            assert_eq!(back.reason, f.reason, "a failure's reason survives a status: {f:?}");
            assert_eq!(back.message, f.message, "a failure's message survives a status: {f:?}");
        }
        let _ =
            ActorResponse::parse_from_bytes(&resp.payload).map(|a| a.actor.as_ref().map(|a| a.state.enum_value_or_default().to_string()));
        let _ = StatusResponse::parse_from_bytes(&resp.payload);
    }
    let _ = ErrorDetail::parse_from_bytes(data).map(|d| d.reason.enum_value().map(Reason::describe));
    let _ = Actor::parse_from_bytes(data).map(|a| crate::ids::ActorId::parse(&a.actor).is_ok());
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Enum;

    #[test]
    fn fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/control");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            fuzz_decode(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no corpus in {dir:?}");
    }

    /// Writes the seed corpus of the fuzz target `control` (run by hand:
    /// `cargo test -p torpor-api control_seeds -- --ignored`).
    #[test]
    #[ignore = "writes the fuzz corpus's seeds"]
    fn control_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/control");
        std::fs::create_dir_all(&dir).unwrap();
        for m in ["Status", "Suspend", "Resume", "Freeze"] {
            let mut r = ttrpc::proto::Request::new();
            r.service = format!("{API}.Control");
            r.method = m.into();
            r.timeout_nano = 1_000_000_000;
            std::fs::write(dir.join(format!("seed-request-{m}")), r.write_to_bytes().unwrap()).unwrap();
        }
        let mut a = Actor::new();
        a.actor = "ns/name".into();
        a.state = State::SUSPENDED.into();
        let mut ar = ActorResponse::new();
        ar.actor = Some(a.clone()).into();
        let mut resp = ttrpc::proto::Response::new();
        resp.payload = ar.write_to_bytes().unwrap();
        std::fs::write(dir.join("seed-response-actor"), resp.write_to_bytes().unwrap()).unwrap();
        let mut f = Failure::new(Reason::LEASE_LOST, "node b holds it");
        f.actor = "ns/name".into();
        let mut resp = ttrpc::proto::Response::new();
        resp.status = Some(f.into_status()).into();
        std::fs::write(dir.join("seed-response-failure"), resp.write_to_bytes().unwrap()).unwrap();
        std::fs::write(dir.join("seed-actor"), a.write_to_bytes().unwrap()).unwrap();
        std::fs::write(dir.join("seed-legacy-json"), br#"{"op":"status"}"#).unwrap();
    }

    #[test]
    fn failures_keep_their_reason_through_a_status() {
        for reason in Reason::VALUES {
            let mut f = Failure::new(*reason, format!("actor ns/a: {reason:?}"));
            f.state = State::FROZEN;
            f.actor = "ns/a".into();
            let status = f.clone().into_status();
            assert_eq!(status.code(), reason.code());
            assert_eq!(status.message, f.message);
            let back = Failure::from_status(&status);
            assert_eq!(back, f, "{reason:?}");
            assert!(back.to_string().contains(&f.message));
        }
        // The reasons the caller must tell apart have different codes or
        // at least different details.
        let reasons = [Reason::LEASE_LOST, Reason::LEASE_HELD, Reason::NOT_FOUND, Reason::ALREADY_IN_STATE, Reason::WRONG_STATE];
        for (i, a) in reasons.iter().enumerate() {
            for b in &reasons[i + 1..] {
                assert_ne!(Failure::from_status(&Failure::new(*a, "x").into_status()).reason, *b);
            }
        }
    }

    #[test]
    fn statuses_without_a_good_detail_fall_back_to_the_code() {
        let status = ttrpc::get_status(ttrpc::Code::UNIMPLEMENTED, "service not found");
        let f = Failure::from_status(&status);
        assert_eq!((f.reason, f.message.as_str()), (Reason::UNIMPLEMENTED, "service not found"));
        // A detail of garbage bytes, or of another type, is ignored.
        let status = ttrpc::get_status(ttrpc::Code::NOT_FOUND, "/torpor.control.v1.Control/Suspend is not supported");
        assert_eq!(Failure::from_status(&status).reason, Reason::UNIMPLEMENTED);
        let mut status = ttrpc::get_status(ttrpc::Code::DATA_LOSS, "gone");
        let mut any = ttrpc::proto::Any::new();
        any.type_url = ERROR_DETAIL_TYPE_URL.into();
        any.value = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
        status.details.push(any);
        let mut other = ttrpc::proto::Any::new();
        other.type_url = "type.googleapis.com/other.Thing".into();
        status.details.push(other);
        let f = Failure::from_status(&status);
        assert_eq!((f.reason, f.message.as_str()), (Reason::CORRUPT, "gone"));
        // An unknown reason (added later) is judged by the code.
        let mut d = ErrorDetail::new();
        d.reason = protobuf::EnumOrUnknown::from_i32(999);
        d.message = "new".into();
        let mut status = ttrpc::get_status(ttrpc::Code::FAILED_PRECONDITION, "new");
        let mut any = ttrpc::proto::Any::new();
        any.type_url = ERROR_DETAIL_TYPE_URL.into();
        any.value = d.write_to_bytes().unwrap();
        status.details.push(any);
        assert_eq!(Failure::from_status(&status).reason, Reason::WRONG_STATE);
    }

    #[test]
    fn protocols_by_first_byte() {
        assert_eq!(Protocol::sniff(0), Protocol::Ttrpc);
        for b in *b"{ \n\t\r" {
            assert_eq!(Protocol::sniff(b), Protocol::LegacyJson);
        }
        for b in [1u8, 0x7f, 0xff, b'G', b'['] {
            assert_eq!(Protocol::sniff(b), Protocol::Unknown);
        }
    }

    #[test]
    fn api_version_and_messages_decode_safely() {
        let v = api_version("1.2.3");
        assert_eq!((v.api.as_str(), v.revision, v.shim_version.as_str()), (API, REVISION, "1.2.3"));
        // Bad bytes are an error, never a panic.
        for bad in [&[0xffu8; 16][..], &[0x0a, 0xff][..], &[0x1a, 0x05, 0x08][..], b"{\"op\":\"status\"}\n"] {
            let _ = StatusResponse::parse_from_bytes(bad);
            let _ = ActorResponse::parse_from_bytes(bad);
        }
        assert!(StatusResponse::parse_from_bytes(&[0xff; 16]).is_err());
    }
}
