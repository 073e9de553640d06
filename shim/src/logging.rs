//! The shim's one logging path: torpor logs through `tracing` (with
//! structured fields); containerd reads what the shim writes through the
//! `log` logger that the containerd-shim crate installs (the shim's log
//! FIFO, in containerd's logfmt) — or, in `delete`, the cleanup's stderr
//! logger. [`LogBridge`] hands every tracing event to whichever `log`
//! logger is installed at that moment, with its fields as the record's
//! key-values, so they stay separate keys in containerd's log
//! (`msg="container restored" container="…" pid=…`).

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Installs the bridge as the global tracing subscriber (once, at start).
/// Only the tracing dispatcher: the `log` logger stays free for
/// containerd-shim to install (`try_init` would take it for a log→tracing
/// bridge when tracing-subscriber's `tracing-log` feature is on, which
/// another crate of the workspace turns on).
pub fn init() {
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(LogBridge));
}

/// A tracing layer that forwards events to the `log` logger.
pub struct LogBridge;

fn level(l: &Level) -> log::Level {
    match *l {
        Level::ERROR => log::Level::Error,
        Level::WARN => log::Level::Warn,
        Level::INFO => log::Level::Info,
        Level::DEBUG => log::Level::Debug,
        Level::TRACE => log::Level::Trace,
    }
}

/// An event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    kv: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.kv.push((field.name().to_string(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.kv.push((field.name().to_string(), format!("{value:?}")));
        }
    }
}

impl<S: Subscriber> Layer<S> for LogBridge {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let lvl = level(meta.level());
        let logger = log::logger();
        let target = meta.target();
        let log_meta = log::Metadata::builder().level(lvl).target(target).build();
        if lvl > log::max_level() || !logger.enabled(&log_meta) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let kvs: Vec<(&str, &str)> = f.kv.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        logger.log(
            &log::Record::builder()
                .metadata(log_meta)
                .args(format_args!("{}", f.message))
                .module_path(meta.module_path())
                .file(meta.file())
                .line(meta.line())
                .key_values(&kvs.as_slice())
                .build(),
        );
    }
}

/// A `log` record's key-values as ` key=value` pairs (the cleanup's stderr
/// logger writes them after the message).
pub fn key_values(r: &log::Record) -> String {
    struct Kv(String);
    impl<'k> log::kv::VisitSource<'k> for Kv {
        fn visit_pair(&mut self, k: log::kv::Key<'k>, v: log::kv::Value<'k>) -> Result<(), log::kv::Error> {
            let _ = write!(self.0, " {k}={v}");
            Ok(())
        }
    }
    let mut kv = Kv(String::new());
    let _ = r.key_values().visit(&mut kv);
    kv.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    struct Capture;

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, r: &log::Record) {
            SEEN.lock().unwrap().push(format!("{} {}{}", r.level(), r.args(), key_values(r)));
        }
        fn flush(&self) {}
    }

    #[test]
    fn events_reach_the_log_logger_with_their_fields_as_key_values() {
        // The log logger stays free for containerd-shim's (here: the test's).
        init();
        assert!(log::set_logger(&Capture).is_ok(), "installing the bridge took the log logger");
        log::set_max_level(log::LevelFilter::Info);
        let subscriber = tracing_subscriber::registry().with(LogBridge);
        tracing::subscriber::with_default(subscriber, || {
            let shim = "abc";
            tracing::warn!(point = "resume-after-persist", shim, n = 3, "failpoint: killing the shim");
            tracing::debug!("not at info");
        });
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen, ["WARN failpoint: killing the shim point=resume-after-persist shim=abc n=3"]);
    }
}
