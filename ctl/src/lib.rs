//! torporctl's library: the client of the shims' control API
//! (torpor.control.v1), shared by the `torporctl` binary and the node agent
//! (`torpor-agent`).

pub mod control;
