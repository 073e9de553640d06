//! containerd's runtime options for a container (the CreateTaskRequest's
//! `options`), as the runtime options of runc-v2 ([`RuncOptions`]).
//!
//! They come in one of two forms, depending on the handler's
//! `runtime_type` in containerd's CRI config:
//!
//! - `containerd.runc.v1.Options` (protobuf), which containerd sends only
//!   to a handler of type `io.containerd.runc.v2` (torpor registered by
//!   `runtime_path`);
//! - `runtimeoptions.v1.Options` (`type_url`, `config_path`,
//!   `config_body`), which CRI sends to every other type, as
//!   `io.containerd.torpor.v1` (deploy/containerd/torpor.toml): the
//!   handler's `options` table as TOML (`config_body`), or the path of a
//!   TOML file of the same keys (`config_path`, when the table sets
//!   `ConfigPath`). Its keys are runc-v2's, read as containerd's TOML
//!   decoder reads them into `runc.v1.Options` (the name of the field,
//!   case not significant).
//!
//! In the TOML form an unknown key is refused, naming it, and so is a key of
//! runc-v2's that torpor does not honour (`ShimCgroup`, `IoUid`, `IoGid`,
//! `TaskApiAddress`, `TaskApiVersion`) unless it has its default value (as
//! in containerd's default runc table): running with defaults would
//! silently ignore what the operator configured.

use std::path::{Path, PathBuf};

use containerd_shim::protos::protobuf::rt::WireType;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{CodedInputStream, Message};
use containerd_shim::protos::shim::oci::Options;
use torpor_runtime::{Error, Result, RuncOptions};

/// The type of runc-v2's options.
const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
/// The type CRI sends to a runtime type other than runc-v2's.
const CRI_OPTIONS: &str = "runtimeoptions.v1.Options";
/// A `config_path` file larger than this is refused.
const CONFIG_FILE_MAX: u64 = 64 * 1024;

/// The options torpor honours, as runc-v2 names them.
const HONOURED: [&str; 7] = ["BinaryName", "Root", "SystemdCgroup", "NoPivotRoot", "NoNewKeyring", "CriuImagePath", "CriuWorkPath"];

/// The runtime options of a Create (`any`: its `options`, if any).
pub fn runtime_options(any: Option<&Any>) -> Result<RuncOptions> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty() || !a.value.is_empty()) else {
        return Ok(RuncOptions::default());
    };
    if any.type_url.ends_with(RUNC_OPTIONS) {
        let o = Options::parse_from_bytes(&any.value).map_err(|e| invalid(format!("runtime options ({}): {e}", any.type_url)))?;
        return from_runc(&o);
    }
    if any.type_url.ends_with(CRI_OPTIONS) {
        return from_cri(&CriOptions::decode(&any.value)?);
    }
    Err(invalid(format!(
        "runtime options of type {:?}: torpor takes {RUNC_OPTIONS} (as runc-v2), or CRI's {CRI_OPTIONS} holding the same keys",
        any.type_url
    )))
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// runc-v2's options message, as runc-v2 takes it. Its fields torpor does
/// not honour (`ShimCgroup`, `IoUid`, `IoGid`, `TaskApi*`) are ignored here:
/// containerd itself sets some of them for a task (`IoUid`/`IoGid` with
/// user namespaces), where an options table is the operator's.
fn from_runc(o: &Options) -> Result<RuncOptions> {
    let path = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
    Ok(RuncOptions {
        binary_name: path(&o.binary_name),
        root: path(&o.root),
        systemd_cgroup: o.systemd_cgroup,
        criu_image_path: path(&o.criu_image_path),
        criu_work_path: path(&o.criu_work_path),
        no_pivot_root: o.no_pivot_root,
        no_new_keyring: o.no_new_keyring,
    })
}

fn not_honoured(name: &str) -> Error {
    invalid(format!("runtime option {name} is not supported by torpor (only at its default); torpor takes {}", HONOURED.join(", ")))
}

/// CRI's `runtimeoptions.v1.Options`.
#[derive(Debug, Default, PartialEq, Eq)]
struct CriOptions {
    type_url: String,
    config_path: String,
    config_body: Vec<u8>,
}

impl CriOptions {
    /// Decodes the message (fields 1, 2 and 3; others skipped, as a
    /// protobuf decoder does).
    fn decode(bytes: &[u8]) -> Result<CriOptions> {
        let bad = |e: &dyn std::fmt::Display| invalid(format!("runtime options ({CRI_OPTIONS}): {e}"));
        let mut input = CodedInputStream::from_bytes(bytes);
        let mut o = CriOptions::default();
        while let Some(tag) = input.read_raw_tag_or_eof().map_err(|e| bad(&e))? {
            let wire = WireType::new(tag & 7).ok_or_else(|| bad(&format!("wire type {} of field {}", tag & 7, tag >> 3)))?;
            match (tag >> 3, wire) {
                (1, WireType::LengthDelimited) => o.type_url = input.read_string().map_err(|e| bad(&e))?,
                (2, WireType::LengthDelimited) => o.config_path = input.read_string().map_err(|e| bad(&e))?,
                (3, WireType::LengthDelimited) => o.config_body = input.read_bytes().map_err(|e| bad(&e))?,
                (1..=3, w) => return Err(bad(&format!("field {} has wire type {w:?}", tag >> 3))),
                (_, w) => input.skip_field(w).map_err(|e| bad(&e))?,
            }
        }
        Ok(o)
    }
}

/// The options CRI's message carries: its TOML body, or the TOML file it
/// names; the type it names, if any, must be runc-v2's.
fn from_cri(o: &CriOptions) -> Result<RuncOptions> {
    if !o.type_url.is_empty() && !o.type_url.ends_with(RUNC_OPTIONS) {
        return Err(invalid(format!("runtime options: TypeUrl {:?}: torpor's options are runc-v2's ({RUNC_OPTIONS})", o.type_url)));
    }
    if !o.config_body.is_empty() {
        let body = std::str::from_utf8(&o.config_body)
            .map_err(|e| invalid(format!("runtime options: the TOML of the options table is not UTF-8: {e}")))?;
        return from_toml(body, "the runtime's options table");
    }
    if o.config_path.is_empty() {
        return Ok(RuncOptions::default());
    }
    let path = Path::new(&o.config_path);
    if !path.is_absolute() {
        return Err(invalid(format!("runtime option ConfigPath {path:?} is not an absolute path")));
    }
    let text = read_config(path).map_err(|e| invalid(format!("runtime option ConfigPath {path:?}: {e}")))?;
    from_toml(&text, &format!("ConfigPath {path:?}"))
}

fn read_config(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(CONFIG_FILE_MAX + 1).read_to_string(&mut text)?;
    if text.len() as u64 > CONFIG_FILE_MAX {
        return Err(std::io::Error::other(format!("larger than {CONFIG_FILE_MAX} bytes")));
    }
    Ok(text)
}

/// runc-v2's options from TOML (`from`: where it came from, for errors).
/// Keys as containerd's TOML decoder matches them to runc.v1.Options'
/// fields: the field's name, case not significant. CRI's own keys
/// (`TypeUrl`, `ConfigPath`) are CRI's message's, not options.
fn from_toml(text: &str, from: &str) -> Result<RuncOptions> {
    let table: toml::Table = text.parse().map_err(|e| invalid(format!("runtime options ({from}): not TOML: {e}")))?;
    let mut o = RuncOptions::default();
    let mut seen: Vec<&str> = Vec::new();
    for (key, value) in &table {
        let Some(name) = KNOWN.iter().map(|(n, _)| *n).find(|n| n.eq_ignore_ascii_case(key)) else {
            return Err(invalid(format!(
                "unknown runtime option {key:?} ({from}): torpor takes {} (runc-v2's names)",
                HONOURED.join(", ")
            )));
        };
        if seen.contains(&name) {
            return Err(invalid(format!("runtime option {name} is given twice ({from}, as {key:?})")));
        }
        seen.push(name);
        let kind = KNOWN.iter().find(|(n, _)| *n == name).map(|(_, k)| *k).unwrap_or(Kind::Ignored);
        let typed = |want: &str| invalid(format!("runtime option {key:?} ({from}) must be {want}, not {} {value}", value.type_str()));
        match kind {
            Kind::Ignored => {}
            Kind::Bool(set) => set(&mut o, value.as_bool().ok_or_else(|| typed("a boolean"))?),
            Kind::Path(set) => {
                let s = value.as_str().ok_or_else(|| typed("a string"))?;
                if !s.is_empty() {
                    set(&mut o, PathBuf::from(s));
                }
            }
            Kind::DefaultString => {
                if !value.as_str().ok_or_else(|| typed("a string"))?.is_empty() {
                    return Err(not_honoured(name));
                }
            }
            Kind::DefaultInteger => {
                if value.as_integer().ok_or_else(|| typed("an integer"))? != 0 {
                    return Err(not_honoured(name));
                }
            }
        }
    }
    Ok(o)
}

/// How a key of runc-v2's options (and of CRI's message) is read.
#[derive(Clone, Copy)]
enum Kind {
    /// CRI's, not an option.
    Ignored,
    Bool(fn(&mut RuncOptions, bool)),
    /// A path; empty is the default.
    Path(fn(&mut RuncOptions, PathBuf)),
    /// Not honoured by torpor: only `""` is accepted.
    DefaultString,
    /// Not honoured by torpor: only `0` is accepted.
    DefaultInteger,
}

/// Every key of runc.v1.Options, and CRI's own two.
const KNOWN: [(&str, Kind); 14] = [
    ("BinaryName", Kind::Path(|o, p| o.binary_name = Some(p))),
    ("Root", Kind::Path(|o, p| o.root = Some(p))),
    ("SystemdCgroup", Kind::Bool(|o, b| o.systemd_cgroup = b)),
    ("NoPivotRoot", Kind::Bool(|o, b| o.no_pivot_root = b)),
    ("NoNewKeyring", Kind::Bool(|o, b| o.no_new_keyring = b)),
    ("CriuImagePath", Kind::Path(|o, p| o.criu_image_path = Some(p))),
    ("CriuWorkPath", Kind::Path(|o, p| o.criu_work_path = Some(p))),
    ("ShimCgroup", Kind::DefaultString),
    ("IoUid", Kind::DefaultInteger),
    ("IoGid", Kind::DefaultInteger),
    ("TaskApiAddress", Kind::DefaultString),
    ("TaskApiVersion", Kind::DefaultInteger),
    ("TypeUrl", Kind::Ignored),
    ("ConfigPath", Kind::Ignored),
];

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::CodedOutputStream;

    /// CRI's message as containerd encodes it.
    fn cri(type_url: &str, config_path: &str, body: &str) -> Any {
        let mut value = Vec::new();
        {
            let mut out = CodedOutputStream::vec(&mut value);
            if !type_url.is_empty() {
                out.write_string(1, type_url).unwrap();
            }
            if !config_path.is_empty() {
                out.write_string(2, config_path).unwrap();
            }
            if !body.is_empty() {
                out.write_bytes(3, body.as_bytes()).unwrap();
            }
            // A field of a later version of the message is skipped.
            out.write_uint64(9, 7).unwrap();
            out.flush().unwrap();
        }
        let mut any = Any::new();
        any.type_url = format!("types.containerd.io/{CRI_OPTIONS}");
        any.value = value;
        any
    }

    fn refused(r: Result<RuncOptions>) -> String {
        match r {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("not refused as an invalid argument: {other:?}"),
        }
    }

    /// deploy/containerd/torpor.toml's table, as containerd 2.4's CRI
    /// marshals it (go-toml v2: literal strings) into config_body.
    #[test]
    fn the_documented_options_table_is_taken_from_cri() {
        let body = "BinaryName = '/usr/local/sbin/runc'\nRoot = '/run/containerd/runc'\nSystemdCgroup = true\n";
        let o = runtime_options(Some(&cri("", "", body))).unwrap();
        assert_eq!(
            o,
            RuncOptions {
                binary_name: Some("/usr/local/sbin/runc".into()),
                root: Some("/run/containerd/runc".into()),
                systemd_cgroup: true,
                ..Default::default()
            }
        );
        // Every honoured key, and containerd's default runc table (the
        // unhonoured ones at their defaults), names in any case.
        let body = "systemdcgroup = true\nNOPIVOTROOT = true\nNoNewKeyring = true\nCriuImagePath = '/ci'\nCriuWorkPath = \"/cw\"\n\
                    ShimCgroup = ''\nIoUid = 0\nIoGid = 0\nBinaryName = ''\nRoot = ''\n";
        let o = runtime_options(Some(&cri("", "", body))).unwrap();
        assert_eq!(
            o,
            RuncOptions {
                systemd_cgroup: true,
                no_pivot_root: true,
                no_new_keyring: true,
                criu_image_path: Some("/ci".into()),
                criu_work_path: Some("/cw".into()),
                ..Default::default()
            }
        );
        // An empty table, or none.
        assert_eq!(runtime_options(Some(&cri("", "", ""))).unwrap(), RuncOptions::default());
        assert_eq!(runtime_options(None).unwrap(), RuncOptions::default());
        // The runc type named explicitly is the same.
        assert!(runtime_options(Some(&cri("containerd.runc.v1.Options", "", "SystemdCgroup = true"))).unwrap().systemd_cgroup);
    }

    #[test]
    fn unknown_mistyped_and_unhonoured_keys_are_refused_by_name() {
        let m = refused(runtime_options(Some(&cri("", "", "SystemdCgroups = true"))));
        assert!(m.contains("unknown runtime option \"SystemdCgroups\"") && m.contains("SystemdCgroup"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "", "SystemdCgroup = 'yes'"))));
        assert!(m.contains("must be a boolean"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "", "ShimCgroup = '/x'"))));
        assert!(m.contains("ShimCgroup is not supported by torpor"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "", "IoUid = 1000"))));
        assert!(m.contains("IoUid is not supported"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "", "SystemdCgroup = true\nsystemdcgroup = false"))));
        assert!(m.contains("given twice"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "", "SystemdCgroup = "))));
        assert!(m.contains("not TOML"), "{m}");
        let m = refused(runtime_options(Some(&cri("io.containerd.runhcs.v1.Options", "", "SystemdCgroup = true"))));
        assert!(m.contains("TypeUrl"), "{m}");
        let mut other = Any::new();
        other.type_url = "types.containerd.io/something.else.Options".into();
        other.value = vec![1];
        let m = refused(runtime_options(Some(&other)));
        assert!(m.contains("something.else.Options"), "{m}");
        // A truncated message.
        let mut broken = cri("", "", "SystemdCgroup = true");
        broken.value.truncate(3);
        refused(runtime_options(Some(&broken)));
    }

    #[test]
    fn a_config_path_is_read_as_the_same_toml() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("torpor-options.toml");
        std::fs::write(&file, "SystemdCgroup = true\nRoot = '/run/r'\n").unwrap();
        let o = runtime_options(Some(&cri("", file.to_str().unwrap(), ""))).unwrap();
        assert!(o.systemd_cgroup);
        assert_eq!(o.root, Some(PathBuf::from("/run/r")));
        let m = refused(runtime_options(Some(&cri("", "relative.toml", ""))));
        assert!(m.contains("not an absolute path"), "{m}");
        let m = refused(runtime_options(Some(&cri("", "/nonexistent/torpor.toml", ""))));
        assert!(m.contains("/nonexistent/torpor.toml"), "{m}");
        std::fs::write(&file, "Bogus = 1\n").unwrap();
        let m = refused(runtime_options(Some(&cri("", file.to_str().unwrap(), ""))));
        assert!(m.contains("Bogus") && m.contains("ConfigPath"), "{m}");
    }

    #[test]
    fn runc_v2s_own_message_is_taken() {
        let mut o = Options::new();
        o.systemd_cgroup = true;
        o.binary_name = "/usr/sbin/runc".into();
        o.io_uid = 1000;
        let mut any = Any::new();
        any.type_url = "containerd.runc.v1.Options".into();
        any.value = o.write_to_bytes().unwrap();
        let r = runtime_options(Some(&any)).unwrap();
        assert!(r.systemd_cgroup);
        assert_eq!(r.binary_name, Some(PathBuf::from("/usr/sbin/runc")));
        any.value = vec![0xff];
        refused(runtime_options(Some(&any)));
    }
}
