//! The task layer: containers, their processes and exits, as containerd
//! sees them ([`Tasks`]), with one [`ContainerState`] per container, and
//! the edge the actor drives them through ([`Containers`]). It
//! knows nothing of actors; it imports only [`crate::system`] and
//! [`crate::oci`].

pub mod container;
pub mod containers;
pub mod process;
pub mod tasks;

pub use container::{Container, ContainerState};
pub use containers::Containers;
pub use process::{wait_exit, ExecState, ExitInfo, Status};
pub use tasks::{AppInfo, Event, ExitHold, NewContainer, ProcessState, Tasks};
