//! The pod annotations torpor's own Kubernetes parts write and read: the
//! node agent (`torpor-agent`) and the kubectl plugin (`kubectl torpor`).
//!
//! They are not actor configuration: containerd passes every `torpor.dev/*`
//! pod annotation to the shim (`pod_annotations = ["torpor.dev/*"]`), so the
//! shim must know these names to pass over them. A container that kubelet
//! creates again after the agent acted on its pod (a crash, an OOM kill, a
//! failed liveness probe) carries them; refusing them as unknown would keep
//! the pod in CrashLoopBackOff for good.

/// The state a pod asks for: `running`, `suspended` or `frozen` (written by
/// `kubectl torpor` or a user, acted on by the agent).
pub const DESIRED: &str = "torpor.dev/desired-state";
/// The value of [`DESIRED`] the agent last acted on (it acts once per
/// request: a request that woke the actor since is not undone). The
/// plugin removes it with each request, so that asking again acts again.
pub const APPLIED: &str = "torpor.dev/applied-state";
/// What the last action did: `ok <op> <ms> ms` or `failed <op>: <reason>`.
pub const RESULT: &str = "torpor.dev/applied-result";
/// The actor's snapshot in the node's store (`<actor>@<generation>`), when it has one.
pub const SNAPSHOT: &str = "torpor.dev/snapshot";
/// The node the pod's actor moved here from, with its state (the agent
/// writes it with the `Moved` Event, once).
pub const MOVED_FROM: &str = "torpor.dev/moved-from";

/// The resource requests the agent lowered while the pod's actor sleeps
/// (JSON: container name → resource → quantity, as the pod had them),
/// written before the pod is resized down and removed once they are back.
pub const REQUESTS: &str = "torpor.dev/requests";

/// What the agent does when a woken actor's requests do not fit its node
/// any more (kubelet defers or refuses the resize up): `stay` (the
/// default: it keeps running on its lowered requests) or `move` (it is
/// suspended and its pod deleted, for its controller to create it again
/// where the scheduler finds room; it continues there from its snapshot).
pub const ON_NO_ROOM: &str = "torpor.dev/on-no-room";

/// Actor configuration, read by the shim (`suspend`: kubelet's stop, as on
/// an eviction, suspends the actor first); the agent reads it too, to warn
/// when it lowers the requests of an actor whose eviction would lose state.
/// Not one of [`AGENT_KEYS`].
pub const ON_STOP: &str = "torpor.dev/on-stop";

/// Every annotation of the agent and the plugin: what they report and what
/// they are asked. The shim reads none of them.
pub const AGENT_KEYS: [&str; 7] = [DESIRED, APPLIED, RESULT, SNAPSHOT, MOVED_FROM, REQUESTS, ON_NO_ROOM];
